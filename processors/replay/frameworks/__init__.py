"""Recorded results for the frameworks' own model interfaces, one module per framework.

* :mod:`.pydantic_ai` — ``ReplayModel``, a pydantic-ai ``Model``;
* :mod:`.openai_agents` — ``ReplayModel`` and ``ReplayModelProvider`` for the OpenAI Agents SDK;
* :mod:`.langchain` — ``ReplayChatModel``, a LangChain ``BaseChatModel`` (LangGraph's models).

Each wraps the model the program would use (``inner``) and sends every call through a
:class:`processors.replay.recorder.Recorder`, which answers it live, from the recording, or both
(what-if) and records it as run events. Each module holds its framework's one conversion between
the framework's request/response and the cache-key shape (``request_of``, ``envelope_of``,
``response_of``). The frameworks are optional (``pip install 'agentlog[replay]'``): this package
imports none of them, and a module imports its framework when it is imported.
"""
