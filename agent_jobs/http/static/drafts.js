// A run's tool calls as the model writes them: each call's arguments grow from its
// `tool_call_delta` frames (the JSON text, piece by piece), then the call's `tool_call`
// frame replaces them with the arguments as recorded, and its status. A `retrying`
// marker takes back what the void attempt of its step was writing.
//
// Text only: every piece goes to the page through textContent (`el`, `setText`).

import { el, pretty, setText } from "./app.js";

export class Drafts {
  constructor(runId, container) {
    this.runId = runId;
    this.container = container;
    this.calls = new Map(); // call id -> {node, args, head, state, step, attempt, text, called}
  }

  // Take a frame of the run's stream; true when it was one of the calls' frames.
  feed(frame) {
    if (frame.run_id !== this.runId) return false;
    if (frame.type === "tool_call_delta") return this.piece(frame);
    if (frame.type === "tool_call") return this.called(frame);
    if (frame.type === "status" && frame.status === "retrying") this.voided(frame.step);
    return false;
  }

  piece(frame) {
    if (typeof frame.args_delta !== "string") return true;
    const id = String(frame.call_id || "#" + frame.index);
    let call = this.calls.get(id);
    if (!call || call.called) {
      if (call) call.node.remove();
      call = this.open(id, frame);
    }
    // A newer attempt of the step writes the call again from its start.
    if (frame.offset === 0 || frame.attempt !== call.attempt) call.text = "";
    call.attempt = frame.attempt;
    call.text += frame.args_delta;
    setText(call.args, call.text, "\n");
    return true;
  }

  open(id, frame) {
    const node = el("div", "draft");
    node.dataset.call = id;
    const head = el("span", "draft-name", frame.name || "a tool");
    const state = el("span", "draft-state", "writing…");
    const args = el("pre", "text draft-args");
    const line = el("div", "draft-head");
    line.append(head, " ", state);
    node.append(line, args);
    this.container.append(node);
    this.container.hidden = false;
    const call = { node, args, head, state, step: frame.step, attempt: frame.attempt, text: "" };
    this.calls.set(id, call);
    return call;
  }

  called(frame) {
    const call = this.calls.get(String(frame.call_id));
    if (!call) return false;
    call.called = true;
    call.node.classList.add("called");
    setText(call.head, frame.tool || "");
    setText(call.state, "called" + (frame.status ? " · " + frame.status : ""));
    setText(call.args, pretty(frame.args), "\n");
    return false; // the page reads the run again, as for any other call
  }

  voided(step) {
    for (const [id, call] of this.calls) {
      if (call.called || (typeof step === "string" && call.step && call.step !== step)) continue;
      call.node.remove();
      this.calls.delete(id);
    }
    if (!this.calls.size) this.container.hidden = true;
  }

  clear() {
    this.calls.clear();
    this.container.replaceChildren();
    this.container.hidden = true;
  }
}
