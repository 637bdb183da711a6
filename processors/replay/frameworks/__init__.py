"""Recorded results for the frameworks' own model interfaces, one module per framework.

* :mod:`.pydantic_ai` — ``ReplayModel``, a pydantic-ai ``Model``; ``ReplayTools``, a capability
  (its ``wrap_tool_execute`` hook) for the agent's tools;
* :mod:`.openai_agents` — ``ReplayModel`` and ``ReplayModelProvider`` for the OpenAI Agents SDK;
  ``replay_tools``, the ``FunctionTool``s with their ``on_invoke_tool`` answered through the recorder;
* :mod:`.langchain` — ``ReplayChatModel``, a LangChain ``BaseChatModel`` (LangGraph's models);
  ``ReplayToolCalls`` / ``replay_tool_node``, a LangGraph ``ToolNode``'s ``wrap_tool_call`` interceptor.

Each wraps the model the program would use (``inner``) and sends every call through a
:class:`agentlog.replay.recorder.Recorder`, which answers it live, from the recording, or both
(what-if) and records it as run events; the tool wrappers send every tool call through it too, to
run the tool or answer it from the recording (``tools="run"`` / ``"recorded"``). Each module holds
its framework's one conversion between the framework's request/response and the cache-key shape
(``request_of``, ``envelope_of``, ``response_of``). The frameworks are optional
(``pip install 'agentlog[replay]'``): this package imports none of them, and a module imports its
framework when it is imported.
"""
