/* Helpers shared by the Quotas page and the job page: building DOM safely (text only, never
   HTML from data), calling the JSON API with the page's login cookie, formatting money and
   numbers, and the priority form. Durations and instants come from the API as text for people
   (its *_text fields, core/human_time.py's words, as on the CLI and in the task log): nothing
   here formats a time. No framework, nothing fetched from the network but the API. */
"use strict";

window.Quota = (function () {
  const body = document.body;
  const root = body.dataset.root || "";
  const refreshSeconds = Number(body.dataset.refresh || 5);

  /** h("td", {class: "num"}, "3") -> <td class="num">3</td>; children are text or nodes. */
  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "style") node.setAttribute("style", value);
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else if (key === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat(Infinity)) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  /** Replace a node's children; null, undefined and false are left out (not "null"). */
  function fill(node, ...children) {
    node.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
    return node;
  }

  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  /** The error's message from a FastAPI answer: a string, or validation errors' "msg". */
  function detailOf(payload, status) {
    const detail = payload && payload.detail;
    if (typeof detail === "string") return detail;
    if (Array.isArray(detail)) return detail.map((d) => d.msg || JSON.stringify(d)).join("; ");
    return "HTTP " + status;
  }

  async function api(path, options) {
    const response = await fetch(root + "/api" + path, Object.assign({
      credentials: "same-origin",
      headers: {"Accept": "application/json", "Content-Type": "application/json"},
    }, options || {}));
    let payload = null;
    try { payload = await response.json(); } catch (e) { payload = null; }
    if (!response.ok) {
      let message = detailOf(payload, response.status);
      if (response.status === 401) message = "Not logged in to Airflow: log in and reload this page.";
      throw new ApiError(response.status, message);
    }
    return payload;
  }

  function money(value) { return "$" + Number(value || 0).toFixed(2); }
  function number(value, digits) { return Number(value || 0).toFixed(digits === undefined ? 2 : digits); }

  /** The answer to a person's change, in #notice (done) or #error (refused): it replaces the
      previous answer and stays until the next one or its dismiss button; refreshes leave it
      alone (their own failures go to #refresh-error). */
  function notice(message, isError) {
    const el = document.getElementById(isError ? "error" : "notice");
    const other = document.getElementById(isError ? "notice" : "error");
    if (other) other.hidden = true;
    fill(el, h("span", {dataset: {role: "message"}}, message),
      h("button", {type: "button", class: "dismiss", title: "Dismiss", "aria-label": "Dismiss", dataset: {role: "dismiss"},
        onclick: () => { el.hidden = true; }}, "×"));
    el.hidden = !message;
  }

  /** Why the last refresh failed (empty: it worked, and the line goes), in #refresh-error. */
  function refreshProblem(message) {
    const el = document.getElementById("refresh-error");
    el.textContent = message;
    el.hidden = !message;
  }

  /** A code such as WAITING_FOR_QUOTA that may break after its underscores in a narrow cell
      (<wbr>: the text stays the code, for reading and copying). */
  function code(text) {
    return String(text).split("_").flatMap((part, i) => (i ? [h("wbr", {}), "_" + part] : [part]));
  }

  function table(headers, rows, empty) {
    if (!rows.length) return h("p", {class: "empty"}, empty);
    return h("div", {class: "scroll"}, h("table", {},
      h("thead", {}, h("tr", {}, headers.map((x) => (typeof x === "string" ? h("th", {}, x) : h("th", x[1], x[0]))))),
      h("tbody", {}, rows)));
  }

  /** Values typed in priority fields, kept across refreshes until sent or abandoned. */
  const drafts = new Map();
  /** Priorities asked for and not yet applied by the quota scheduler, by job id. */
  const asked = new Map();

  /** A priority field and "Set" button for a job this user may change; plain text otherwise. */
  function priorityControl(job, maxPriority, onDone) {
    if (asked.get(job.id) === job.priority) asked.delete(job.id);
    const pending = asked.has(job.id) ? h("span", {class: "muted", dataset: {role: "asked"}}, " (" + asked.get(job.id) + " asked)") : null;
    if (!job.can_edit || !job.can_set_priority) return h("span", {class: "prio", dataset: {role: "priority-value"}}, String(job.priority));
    const input = h("input", {
      type: "number", min: 0, max: maxPriority === undefined ? 9999 : maxPriority, step: 1,
      value: drafts.has(job.id) ? drafts.get(job.id) : job.priority,
      "aria-label": "priority of " + job.name, dataset: {jobId: job.id, role: "priority"},
      oninput: (event) => drafts.set(job.id, event.target.value),
    });
    const form = h("form", {class: "prio-form", dataset: {jobId: job.id, priority: job.priority}}, input,
      h("button", {type: "submit", dataset: {role: "set-priority"}}, "Set"), pending);
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const value = Number(input.value);
      try {
        const answer = await api("/jobs/" + job.id + "/priority", {method: "PUT", body: JSON.stringify({priority: value})});
        drafts.delete(job.id);
        asked.set(job.id, value);
        notice(job.name + ": " + answer.message, false);
        if (onDone) onDone();
      } catch (error) {
        notice(job.name + ": " + error.message, true);
      }
    });
    return form;
  }

  /** Run ``refresh`` now and every few seconds while the checkbox (if any) is on and the tab
      is visible; a field being edited keeps its focus and value across re-renders. ``refresh``
      returns the API's ``now_text`` ("23:04 UTC"), which the header shows as "Updated …". */
  function poll(refresh) {
    const toggle = document.getElementById("auto-refresh");
    let timer = null;
    async function tick() {
      clearTimeout(timer);
      const focused = document.activeElement && document.activeElement.dataset ? document.activeElement.dataset.jobId : null;
      try {
        const now = await refresh();  // the API's now_text: the quota scheduler's clock, in UTC
        refreshProblem("");
        document.getElementById("updated").textContent = now ? "Updated " + now + "." : "";
      } catch (error) {
        refreshProblem("The page could not refresh: " + (error.message || String(error)));
      }
      if (focused) {
        const again = document.querySelector('input[data-role="priority"][data-job-id="' + focused + '"]');
        if (again) { again.focus(); const n = again.value.length; try { again.setSelectionRange(n, n); } catch (e) { /* number inputs */ } }
      }
      if (!toggle || toggle.checked) timer = setTimeout(tick, refreshSeconds * 1000);
    }
    if (toggle) toggle.addEventListener("change", () => { if (toggle.checked) tick(); else clearTimeout(timer); });
    document.addEventListener("visibilitychange", () => { if (!document.hidden) tick(); });
    tick();
    return tick;
  }

  return {root, refreshSeconds, h, fill, api, money, number, notice, code, table, priorityControl, poll, drafts, asked};
})();
