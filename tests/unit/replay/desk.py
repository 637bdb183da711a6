"""A support desk, written once for the suite programs of every framework (no framework imports here).

A run is asked ``{"order": "<id>", "question": "<text>"}`` (:func:`inputs`). The **triage** agent looks the order
up with the ``lookup_order`` tool; when the question asks for a refund it hands the customer on with the
``transfer_to_refunds`` tool, else it answers with what the lookup said. Where the hand-off goes is the program's
code, not the model's: :func:`route` sends it to the **refunds** agent (which calls the ``refund`` tool, then
answers with its result) or, under the changed routing, refunds of orders from :data:`ESCALATE_FROM` on to the
**escalation** agent. The scripted models (:func:`decide`) read the question and the tool results from the
conversation, so one program records and replays every input.

The framework modules (``suite_desk_pydantic_ai``, ``suite_desk_openai_agents``, ``suite_desk_langgraph``) each
export the same four programs: ``desk`` (as recorded), ``desk_prompt_v2`` (triage's instructions changed),
``desk_refund_v2`` (the refund tool returns something else) and ``desk_routing_v2`` (the changed routing).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

TRIAGE, REFUNDS, ESCALATION = "triage", "refunds", "escalation"
INSTRUCTIONS = "Look the order up; hand refunds to the refunds desk."
INSTRUCTIONS_V2 = "Look the order up and answer briefly; hand refunds to the refunds desk."
REFUNDS_INSTRUCTIONS = "Refund the order and confirm it."
ESCALATION_INSTRUCTIONS = "Pass the refund to a person and say so."
LOOKUP, TRANSFER, REFUND = "lookup_order", "transfer_to_refunds", "refund"
REFUND_NOTE, REFUND_NOTE_V2 = "refund issued", "refund queued for review"
#: Under the changed routing, refunds of orders from this id on go to the escalation agent.
ESCALATE_FROM = 110


def inputs(n: int) -> list[dict[str, str]]:
    """``n`` varied inputs, one order each (ids from 100): every third asks for a refund."""
    out = []
    for i in range(n):
        order = str(100 + i)
        question = f"Please refund my order {order}." if i % 3 == 0 else f"Where is my order {order}?"
        out.append({"order": order, "question": question})
    return out


def asks_refund(asked: dict[str, str]) -> bool:
    return "refund" in asked["question"].lower()


def route(order: str, *, escalate_from: int | None = None) -> str:
    """The agent a refund is handed to: refunds, or with ``escalate_from``, escalation for orders from it on."""
    return ESCALATION if escalate_from is not None and int(order) >= escalate_from else REFUNDS


def lookup_order(order_id: str) -> str:
    return f"order {order_id}: " + ("delivered" if int(order_id) % 2 == 0 else "in transit")


def refund(order_id: str, note: str = REFUND_NOTE) -> str:
    return f"order {order_id}: {note}"


def transferred(agent: str) -> str:
    """The hand-off tool's result where the program says where it went (pydantic-ai)."""
    return f"Transferred to {agent}"


#: The hand-off tool's result where a router routes it and says nothing of where (LangGraph).
HANDED_OVER = "Handed over"


@dataclass(frozen=True)
class Action:
    """What a scripted model answers: a tool call (``tool``, ``args``, ``call_id``) or a text."""

    text: str = ""
    tool: str | None = None
    args: dict[str, Any] | None = None
    call_id: str = ""


def decide(agent: str, question: str, returned: Sequence[tuple[str, str]]) -> Action:
    """The scripted model of ``agent``, from the question and the tool results (name, result) in its conversation."""
    order = (re.findall(r"\d+", question) or ["0"])[0]
    results = dict(returned)
    if agent == TRIAGE:
        if LOOKUP not in results:
            return Action(tool=LOOKUP, args={"order_id": order}, call_id="call-lookup")
        if "refund" in question.lower() and TRANSFER not in results:
            return Action(tool=TRANSFER, args={}, call_id="call-transfer")
        return Action(text=results[TRANSFER] if TRANSFER in results else results[LOOKUP])
    if agent == REFUNDS:
        if REFUND not in results:
            return Action(tool=REFUND, args={"order_id": order}, call_id="call-refund")
        return Action(text=results[REFUND])
    return Action(text=f"order {order}: passed to a person for review")
