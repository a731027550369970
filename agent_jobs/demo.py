"""The bundled demo: a support agent that looks two things up at once, asks to refund,
and answers. It runs with no configuration at all (`agent-jobs run "…"`).

`build_demo_app(model)` builds a new app each time, so no two callers share its state;
`load_app(None)` builds it on the model `AGENT_JOBS_MODEL` names.
"""

from __future__ import annotations

import json
import re
import time

from .app import AgentApp
from .messages import Message, ModelRequest, ModelResponse, ToolCall, Usage
from .models.base import DeltaSink, Model, args_writer
from .models.scripted import estimate_tokens

ORDERS = {
    "42": {"order_id": "42", "item": "espresso grinder", "amount": 129.0, "carrier": "DHL"},
    "7": {"order_id": "7", "item": "milk jug", "amount": 18.5, "carrier": "UPS"},
}
SHIPMENTS = {
    "42": {"status": "lost", "last_seen": "Leipzig hub", "days_since_update": 9},
    "7": {"status": "delivered", "last_seen": "front door", "days_since_update": 1},
}


def lookup_order(order_id: str) -> dict[str, object]:
    """Look up an order by its id: item, amount paid, carrier."""
    time.sleep(0.3)
    if order_id not in ORDERS:
        raise KeyError(f"no order {order_id}")
    return ORDERS[order_id]


def track_shipment(order_id: str) -> dict[str, object]:
    """Where the order's parcel is now, according to the carrier."""
    time.sleep(0.3)
    if order_id not in SHIPMENTS:
        raise KeyError(f"no shipment for order {order_id}")
    return SHIPMENTS[order_id]


def refund(order_id: str, amount: float) -> dict[str, object]:
    """Refund an amount on an order. Needs a lead's approval."""
    return {"order_id": order_id, "refunded": amount, "reference": f"RF-{order_id}-001"}


class SupportDemoModel:
    """A scripted model that reacts to tool results, so the demo reads naturally."""

    name = "demo-support"

    def __init__(self, pace: float = 0.015) -> None:
        self.pace = pace

    def run_turn(self, request: ModelRequest, sink: DeltaSink) -> ModelResponse:
        results = {m.name: m for m in request.messages if m.role == "tool"}
        question = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
        order_id = (re.findall(r"\d+", question) or ["42"])[0]
        text, calls = self._reply(order_id, results)
        for word in re.findall(r"\S+\s*", text):
            time.sleep(self.pace)
            sink.text(word)
        self._write_calls(calls, sink)
        prompt = request.system + "".join(m.content for m in request.messages)
        return ModelResponse(
            text=text,
            tool_calls=calls,
            usage=Usage(input_tokens=estimate_tokens(prompt), output_tokens=estimate_tokens(text)),
            model=self.name,
        )

    def _write_calls(self, calls: list[ToolCall], sink: DeltaSink) -> None:
        """Stream each call's arguments a few characters at a time, as a provider does."""
        write = args_writer(sink)
        if write is None:
            return
        for index, call in enumerate(calls):
            text = json.dumps(call.args)
            for offset in range(0, len(text), 6):
                time.sleep(self.pace)
                write(call.id, call.name, text[offset : offset + 6], index=index, offset=offset)

    def _reply(
        self, order_id: str, results: dict[str | None, Message]
    ) -> tuple[str, list[ToolCall]]:
        step = 1 + sum(1 for m in results.values() if m.role == "tool")
        if "lookup_order" not in results:
            return (
                f"Let me check order {order_id} and its shipment. ",
                [
                    ToolCall(id=f"call_{step}", name="lookup_order", args={"order_id": order_id}),
                    ToolCall(
                        id=f"call_{step + 1}", name="track_shipment", args={"order_id": order_id}
                    ),
                ],
            )
        order, shipment = results["lookup_order"], results.get("track_shipment")
        if order.is_error:
            return f"I could not find order {order_id}. Could you check the number?", []
        details = json.loads(order.content)
        lost = shipment is not None and not shipment.is_error and '"lost"' in shipment.content
        if not lost:
            return (
                f"Order {order_id} ({details['item']}) is on its way with {details['carrier']}; "
                "no action is needed.",
                [],
            )
        if "refund" not in results:
            return (
                f"The {details['item']} was lost in transit. I'd like to refund "
                f"{details['amount']:.2f}. ",
                [
                    ToolCall(
                        id=f"call_{step}",
                        name="refund",
                        args={"order_id": order_id, "amount": details["amount"]},
                    )
                ],
            )
        if results["refund"].is_error:
            return (
                f"The refund for order {order_id} was not approved, so I have escalated the "
                "lost parcel to the carrier instead.",
                [],
            )
        reference = json.loads(results["refund"].content)["reference"]
        return (
            f"Order {order_id} ({details['item']}) was lost in transit, so I refunded "
            f"{details['amount']:.2f} (reference {reference}). It shows up in 3-5 days.",
            [],
        )


def build_demo_app(model: Model | None = None) -> AgentApp:
    """A new demo app whose support agent runs on `model` (default: the scripted
    `SupportDemoModel`)."""
    app = AgentApp(
        roles={"cli": ["support", "lead"], "user-7": ["support"], "alice": ["lead"]},
        name="demo",
    )
    app.tool(kind="read")(lookup_order)
    app.tool(kind="read")(track_shipment)
    app.tool(kind="action", roles=["support"], approvers=["lead"])(refund)
    app.agent(
        "support",
        model=model if model is not None else SupportDemoModel(),
        system="You are a support agent. Look things up before acting; refunds need approval.",
        tools=["lookup_order", "track_shipment", "refund"],
    )
    return app
