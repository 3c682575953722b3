// thinkloop's web page: start runs, follow their events live, answer approval requests.
// Text from runs (goals, model output, tool output) is only ever put in the page as text nodes
// (`textContent`), never parsed as HTML.
// With a token, the page asks for it once and keeps it in sessionStorage (this tab only): it goes in the
// Authorization header of every request, and in a subprotocol of the WebSocket (which has no headers).
"use strict";

const $ = (id) => document.getElementById(id);
// `active`: whether the run runs in this server (null: not known yet); `reconnecting`: the stream dropped
const view = { runId: null, socket: null, lastSeq: 0, done: false, approvals: new Map(), retry: null, active: null,
  reconnecting: false };
const TOKEN_KEY = "thinkloop.token";
const EVENTS_PROTOCOL = "thinkloop.events.v1";
const TOKEN_PROTOCOL = "thinkloop.token.";
const auth = { token: sessionStorage.getItem(TOKEN_KEY), locked: false };
const UNFINISHED_NOTE = "This run did not finish and is not running in this server (its process stopped?). " +
  "Resume continues it from its last checkpoint; no finished tool call runs again.";
const NOT_WAITING = "not waiting any more: the run is not running in this server";

// ------------------------------------------------------------------------------------------ helpers

function el(tag, className, ...children) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  for (const child of children) {
    if (child === null || child === undefined || child === "") continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function pre(text) {
  return el("pre", "", text);
}

function json(value) {
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

function seconds(value) {
  return typeof value === "number" ? `${value.toFixed(2)} s` : "";
}

async function api(method, path, body) {
  const options = { method, headers: {} };
  if (method === "POST" && body === undefined) body = {}; // the server takes JSON bodies only
  if (body !== undefined) {
    options.headers["Content-Type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const sent = auth.token;
  if (sent) options.headers.Authorization = `Bearer ${sent}`;
  let response;
  try {
    response = await fetch(path, options);
  } catch (failure) { // no answer at all: the browser says only "Failed to fetch"
    throw new Error(`cannot reach the server (${failure.message}): is it running? Try again when it is back`);
  }
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (response.status === 401) {
    if (sent === auth.token) lock(sent ? "The server refused this token: check it and enter it again." : "");
    throw new Error("the server needs its access token");
  }
  if (!response.ok) {
    const message = data && data.error ? data.error : `${response.status} ${response.statusText}`;
    // `body`: the server's whole answer (null if not JSON), for fields beyond `error` (e.g. `forceable`)
    throw Object.assign(new Error(message), { status: response.status, body: data });
  }
  return data;
}

// A resume refused because a live thinkloop process on this machine seems to run the run still: the only 409
// that `{"force": true}` overrides, which the server marks `"forceable": true` (not "already ended", nor "running
// in this server already"). Its message is only shown, never parsed.
function forceable(error) {
  return error.status === 409 && Boolean(error.body) && error.body.forceable === true;
}

// ------------------------------------------------------------------------------------------ the token

function lock(message) {
  if (auth.locked && !message) return; // another request already asked, maybe with a better message
  auth.locked = true;
  auth.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  closeSocket();
  $("app").hidden = true;
  $("login").hidden = false;
  $("token-error").textContent = message;
  $("token").value = "";
  $("token").focus();
}

async function submitToken(event) {
  event.preventDefault();
  const token = $("token").value.trim();
  if (!/^[\x21-\x7e]+$/.test(token)) {
    $("token-error").textContent = "A token has only printable ASCII characters, without spaces.";
    return;
  }
  auth.token = token;
  $("token-error").textContent = "";
  $("token-submit").disabled = true;
  try {
    await loadInfo(true);
  } catch (error) {
    if (auth.token === token) $("token-error").textContent = error.message; // not a refusal: say why
    return;
  } finally {
    $("token-submit").disabled = false;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  auth.locked = false;
  $("login").hidden = true;
  $("app").hidden = false;
  $("token").value = "";
  loadRuns();
  if (view.runId) selectRun(view.runId);
}

function base64url(text) {
  return btoa(text).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

// ------------------------------------------------------------------------------------------ the agent

async function loadInfo(raise = false) {
  try {
    const info = await api("GET", "/api/info");
    const parts = [`model ${info.model}`, `tools: ${info.tools.join(", ") || "none"}`];
    if (info.safety) parts.push(`safety ${info.safety}`);
    parts.push(`max ${info.budget.max_steps} steps`);
    $("agent-info").textContent = parts.join(" · ");
  } catch (error) {
    if (raise) throw error;
    if (!auth.locked) $("agent-info").textContent = error.message;
  }
}

// ------------------------------------------------------------------------------------------ runs list

async function loadRuns() {
  if (auth.locked) return;
  let runs;
  try {
    runs = (await api("GET", "/api/runs?limit=50")).runs;
  } catch {
    return; // the list is refreshed again shortly
  }
  const list = $("runs");
  list.replaceChildren(
    ...runs.map((run) => {
      const unfinished = !run.active && run.status === "running"; // interrupted, or running elsewhere
      const status = run.active ? "running" : unfinished ? "unfinished" : run.stop_reason || run.status;
      const badge = el("span", `badge ${run.active ? "running" : unfinished ? "unfinished" : run.status}`, status);
      const item = el("li", run.run_id === view.runId ? "selected" : "", el("span", "goal", run.goal), badge,
        el("span", "meta", new Date(run.created_at * 1000).toLocaleString()));
      item.dataset.runId = run.run_id;
      item.title = run.goal;
      item.tabIndex = 0;
      item.addEventListener("click", () => selectRun(run.run_id));
      item.addEventListener("keydown", (e) => { if (e.key === "Enter") selectRun(run.run_id); });
      return item;
    }),
  );
}

async function startRun(event) {
  event.preventDefault();
  const goal = $("goal").value;
  const body = { goal };
  const steps = $("max-steps").value.trim();
  if (steps) body.max_steps = Number(steps);
  $("start-error").textContent = "";
  $("start").disabled = true;
  try {
    const { run_id: runId } = await api("POST", "/api/runs", body);
    $("goal").value = "";
    selectRun(runId);
    await loadRuns();
  } catch (error) {
    $("start-error").textContent = error.message;
  } finally {
    $("start").disabled = false;
  }
}

// ------------------------------------------------------------------------------------------ one run

function selectRun(runId) {
  closeSocket();
  Object.assign(view, { runId, lastSeq: 0, done: false, approvals: new Map(), active: null, reconnecting: false });
  for (const item of $("runs").children) item.classList.toggle("selected", item.dataset.runId === runId);
  $("placeholder").hidden = true;
  $("run-view").hidden = false;
  for (const id of ["run-goal", "run-status", "run-note", "answer", "stop-reason"]) $(id).textContent = "";
  $("events").replaceChildren();
  $("approvals").replaceChildren();
  $("answer-box").hidden = true;
  $("cancel").hidden = false;
  $("cancel").disabled = false;
  $("resume").hidden = true;
  $("force-resume").hidden = true;
  refreshRun(runId);
  openSocket();
}

// The run's summary: whether it runs in this server (Cancel), or did not finish and runs nowhere (Resume).
// Asked when a run is selected, when its stream comes back after a drop (the server may have restarted,
// interrupting it), and when it was resumed.
function refreshRun(runId) {
  api("GET", `/api/runs/${encodeURIComponent(runId)}`)
    .then((data) => { if (view.runId === runId) showSummary(data.run); })
    .catch((error) => { if (view.runId === runId) $("run-status").textContent = error.message; });
}

function showSummary(run) {
  view.active = run.active;
  $("run-goal").textContent = run.goal;
  if (view.done) return;
  const unfinished = !run.active && run.status === "running";
  $("cancel").hidden = !run.active;
  $("cancel").disabled = false;
  $("resume").hidden = !unfinished;
  $("resume").disabled = false;
  if (unfinished) {
    $("run-note").textContent = UNFINISHED_NOTE;
  } else if ($("run-note").textContent === UNFINISHED_NOTE) {
    $("run-note").textContent = "";
  }
  if (run.active) $("force-resume").hidden = true;
  // nobody in this server waits for an answer: the card's buttons would answer nothing (a resume asks again)
  if (!run.active) for (const callId of [...view.approvals.keys()]) settleApproval(callId, null, NOT_WAITING);
}

function closeSocket() {
  clearTimeout(view.retry);
  if (view.socket) {
    view.socket.onclose = null;
    view.socket.close();
    view.socket = null;
  }
}

function openSocket() {
  const runId = view.runId;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const url = `${scheme}://${location.host}/api/runs/${encodeURIComponent(runId)}/events?after=${view.lastSeq}`;
  const protocols = [EVENTS_PROTOCOL];
  if (auth.token) protocols.push(TOKEN_PROTOCOL + base64url(auth.token));
  const socket = new WebSocket(url, protocols);
  view.socket = socket;
  socket.onopen = () => {
    if (view.socket !== socket || !view.reconnecting) return;
    view.reconnecting = false; // back: what happened meanwhile (a restart interrupts the run) is asked again
    $("run-status").textContent = "";
    refreshRun(runId);
  };
  socket.onmessage = (message) => {
    if (view.runId !== runId) return;
    const event = JSON.parse(message.data);
    if (event.seq <= view.lastSeq) return; // already shown
    view.lastSeq = event.seq;
    show(event);
  };
  socket.onclose = (close) => {
    if (view.socket !== socket) return;
    view.socket = null;
    if (close.code === 4404) {
      $("run-status").textContent = close.reason || "No such run.";
    } else if (close.code === 1000 && close.reason === "done") { // the log ended without a `done` event
      refreshRun(runId);
    } else if (!view.done) { // the connection dropped: follow again from the last event seen
      view.reconnecting = true;
      $("run-status").textContent = `Lost the connection to the server${close.reason ? ` (${close.reason})` : ""}: ` +
        "reconnecting…";
      view.retry = setTimeout(() => reconnect(runId), 1000);
    }
  };
}

async function reconnect(runId) {
  if (view.runId !== runId || auth.locked || view.socket) return;
  if (auth.token) { // a WebSocket refused for its token only says "closed": ask over HTTP, which locks the page
    try {
      await api("GET", "/api/info");
    } catch {
      if (auth.locked) return;
    }
  }
  if (view.runId === runId && !auth.locked && !view.socket) openSocket();
}

// `force`: resume even if a live process seems to run it still ("Resume anyway", offered after that refusal only).
async function resumeRun(force) {
  const runId = view.runId;
  $("resume").disabled = true;
  $("resume-force").disabled = true;
  try {
    await api("POST", `/api/runs/${encodeURIComponent(runId)}/resume`, force ? { force: true } : {});
  } catch (error) {
    if (view.runId !== runId) return; // another run is shown now
    $("run-note").textContent = error.message;
    $("force-resume").hidden = !forceable(error);
    $("resume").disabled = false;
    $("resume-force").disabled = false;
    return;
  }
  if (view.runId !== runId) return;
  $("resume").hidden = true;
  $("force-resume").hidden = true;
  $("run-note").textContent = "Resumed.";
  $("cancel").hidden = false;
  $("cancel").disabled = false;
  closeSocket(); // follow it live from the last event seen
  openSocket();
  loadRuns();
}

async function cancelRun() {
  $("cancel").disabled = true;
  try {
    await api("POST", `/api/runs/${encodeURIComponent(view.runId)}/cancel`);
  } catch (error) {
    $("run-status").textContent = error.message;
  }
}

// ------------------------------------------------------------------------------------------ events

const renderers = {
  run_started: (e) => [`model ${e.model}, ${e.mode} mode${e.resumed ? " (resumed)" : ""}`],
  progress: (e) => [`step ${e.step} of ${e.max_steps}`, el("span", "meta",
    `${e.usage.input_tokens + e.usage.output_tokens} tokens so far`)],
  thought: (e) => [pre(e.text)],
  tool_call: (e) => [el("code", "", e.call.name), el("span", `risk ${e.risk}`, e.risk),
    el("span", "meta", e.decision), pre(e.call.raw_arguments ?? json(e.call.arguments))],
  tool_result: (e) => [el("code", "", e.name), el("span", "meta",
    `${e.success ? "ok" : `failed${e.error_kind ? ` (${e.error_kind})` : ""}`} · ${seconds(e.duration)}` +
    `${e.truncated ? " · truncated" : ""}`), pre(e.output)],
  model_call: (e) => [e.model, el("span", "meta", `${seconds(e.duration)} · ${e.input_tokens} in, ` +
    `${e.output_tokens} out${e.tool_calls ? ` · ${e.tool_calls} tool call(s)` : ""}${e.final ? " · final" : ""}`)],
  approval_requested: (e) => [el("code", "", e.call.name), el("span", `risk ${e.risk}`, e.risk), pre(e.reason)],
  hint: (e) => [pre(e.text)],
  mode_switched: (e) => [`${e.from_mode} → ${e.to_mode}: ${e.reason}`],
  model_attempt: (e) => [`${e.model} attempt ${e.attempt} failed (${e.next_action}): ${e.error}`],
  status: (e) => [e.text],
  error: (e) => [pre(e.message)],
  done: (e) => [e.result.stop_reason, el("span", "meta", `${e.result.steps} steps · ` +
    `${e.result.tool_calls} tool calls · ${seconds(e.result.duration)}`)],
};

function show(event) {
  if (event.type === "answer_delta") {
    $("answer-box").hidden = false;
    $("answer").append(document.createTextNode(event.text));
    return;
  }
  if (event.type === "answer_reset") { // the text streamed so far was not the answer
    $("answer").textContent = "";
    $("answer-box").hidden = true;
    return;
  }
  const render = renderers[event.type] || ((e) => [pre(json(e))]);
  const names = { tool_call: "tool call", tool_result: "result", model_call: "model call",
    approval_requested: "approval requested", run_started: "started", mode_switched: "mode switch",
    model_attempt: "model attempt" };
  const item = el("li", event.type, el("span", "kind", names[event.type] || event.type.replace("_", " ")),
    ...render(event));
  if (event.type === "tool_result") item.classList.add(event.success ? "ok" : "failed");
  item.dataset.seq = event.seq;
  $("events").append(item);
  if (event.type === "progress") $("run-status").textContent = `Step ${event.step} of ${event.max_steps}…`;
  if (event.type === "run_started" && event.resumed) { // running again, maybe in this server: ask
    view.active = null;
    refreshRun(view.runId);
  }
  if (event.type === "approval_requested") showApproval(event);
  if (event.type === "tool_call") settleApproval(event.call.id, event.decision);
  if (event.type === "done") finish(event.result);
}

function finish(result) {
  view.done = true;
  $("answer-box").hidden = false;
  $("answer").textContent = result.output || "(no answer)";
  const reason = el("span", "", `Stopped: ${result.stop_reason}${result.forced_final ? " (best-effort answer)" : ""}`);
  $("stop-reason").replaceChildren(reason, result.error ? el("span", "meta", result.error) : "");
  $("run-status").textContent = `${result.steps} steps · ${result.tool_calls} tool calls · ` +
    `${result.usage.input_tokens + result.usage.output_tokens} tokens · ${seconds(result.duration)}`;
  $("cancel").hidden = true;
  $("resume").hidden = true;
  $("force-resume").hidden = true;
  for (const callId of view.approvals.keys()) settleApproval(callId, null);
  loadRuns();
}

// ------------------------------------------------------------------------------------------ approvals

function showApproval(event) {
  const runId = view.runId;
  const callId = event.call.id;
  settleApproval(callId, null, "asked again below"); // by a resumed run: this card answers nothing now
  const message = el("input", "");
  message.placeholder = "Message to the model (optional, on deny)";
  message.setAttribute("aria-label", "Message to the model");
  const error = el("p", "error");
  const buttons = ["approve", "approve_always", "deny"].map((decision) => {
    const labels = { approve: "Approve", approve_always: "Approve always", deny: "Deny" };
    const button = el("button", decision === "deny" ? "danger" : decision === "approve" ? "" : "secondary",
      labels[decision]);
    button.type = "button";
    button.dataset.decision = decision;
    button.addEventListener("click", async () => {
      for (const b of buttons) b.disabled = true;
      try {
        const body = { decision };
        if (message.value.trim()) body.message = message.value.trim();
        await api("POST", `/api/runs/${encodeURIComponent(runId)}/approvals/${encodeURIComponent(callId)}`, body);
        if (view.approvals.has(callId)) { // the run's tool_call event has not settled the card yet
          const answered = { approve: "approved", approve_always: "approved always", deny: "denied" };
          card.querySelector(".state").textContent = answered[decision];
        }
      } catch (failure) {
        error.textContent = failure.message;
        if (view.approvals.get(callId)?.card === card) for (const b of buttons) b.disabled = false; // still open
      }
    });
    return button;
  });
  const card = el("div", "approval",
    el("div", "", el("strong", "", "Approval needed: "), el("code", "", event.call.name), " ",
      el("span", `risk ${event.risk}`, event.risk), el("span", "meta state", "waiting")),
    pre(event.call.raw_arguments ?? json(event.call.arguments)), el("p", "muted", event.reason),
    el("div", "buttons", ...buttons, message), error);
  card.dataset.callId = callId;
  view.approvals.set(callId, { card, buttons, message });
  $("approvals").append(card);
  if (view.active === false) settleApproval(callId, null, NOT_WAITING); // replayed from the log
}

function settleApproval(callId, decision, why = "no answer needed any more") {
  const entry = view.approvals.get(callId);
  if (!entry) return;
  view.approvals.delete(callId);
  entry.card.classList.add("answered");
  for (const b of entry.buttons) b.disabled = true;
  entry.message.disabled = true;
  entry.card.querySelector(".state").textContent = decision ? decision.replace("_", " ") : why;
}

// ------------------------------------------------------------------------------------------ start

document.addEventListener("DOMContentLoaded", () => {
  $("start-form").addEventListener("submit", startRun);
  $("cancel").addEventListener("click", cancelRun);
  $("resume").addEventListener("click", () => resumeRun(false));
  $("resume-force").addEventListener("click", () => resumeRun(true));
  $("token-form").addEventListener("submit", submitToken);
  loadInfo();
  loadRuns();
  setInterval(loadRuns, 3000);
});
