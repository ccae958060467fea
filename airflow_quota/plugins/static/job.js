/* One quota job's page (where the task's "Quota job" link leads): what it is, where it stands,
   its attempts (placements), the preemptions it suffered and caused, its alerts and its story.
   A user who may edit its DAG can change its priority or cancel it. */
"use strict";

(function () {
  const {h, fill, api, money, number, table, priorityControl, poll, notice, root} = window.Quota;
  const jobId = Number(document.body.dataset.jobId);
  let tick = null;
  let maxPriority = 9999;

  function kv(pairs) {
    return h("dl", {class: "kv"}, pairs.filter((p) => p[1] !== null && p[1] !== undefined && p[1] !== "").map(([k, v]) => [h("dt", {}, k), h("dd", {dataset: {field: k}}, v)]));
  }

  function preemptionRows(list, victim) {
    return list.map((p) => h("tr", {dataset: {preemptionId: p.id, kind: p.kind}},
      h("td", {}, p.at_text),
      h("td", {}, victim ? (p.preemptor_id ? h("a", {href: root + "/jobs/" + p.preemptor_id}, p.preemptor) : p.preemptor) : h("a", {href: root + "/jobs/" + p.job_id}, p.job)),
      h("td", {}, p.kind),
      h("td", {class: "num"}, String(p.attempt)),
      h("td", {}, p.count ? p.count + "× " + p.instance_type : ""),
      h("td", {class: "num"}, p.lost_text)));
  }

  async function cancel(job) {
    if (!window.confirm("Cancel quota job " + job.name + "? It ends FAILED with CANCELLED.")) return;
    try {
      const answer = await api("/jobs/" + job.id + "/cancel", {method: "POST", body: "{}"});
      notice(job.name + ": " + answer.message, false);
      if (tick) tick();
    } catch (error) {
      notice(job.name + ": " + error.message, true);
    }
  }

  async function refresh() {
    const [detail, shares] = await Promise.all([api("/jobs/" + jobId), api("/shares")]);
    const job = detail.job;
    const share = shares.shares.find((s) => s.name === job.share);
    if (share) maxPriority = share.max_priority;
    document.title = "Quota job " + job.name;
    fill(document.getElementById("job-title"), job.name + " ", h("span", {class: "badge state-" + job.state, dataset: {role: "state"}}, job.state),
      job.borrowed && ["SCHEDULED", "STARTING", "RUNNING"].includes(job.state) ? h("span", {class: "badge borrowing"}, "borrowing " + job.borrowed) : null);
    const live = ["SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING"].includes(job.state);
    fill(document.getElementById("job-actions"),
      h("span", {class: "muted"}, "priority "), priorityControl(job, maxPriority, () => tick && tick()),
      live && job.can_edit ? h("button", {class: "action danger", type: "button", onclick: () => cancel(job), dataset: {role: "cancel"}}, "Cancel job") : null);
    const waiting = job.state === "RUNNABLE" || job.state === "SUBMITTED";
    fill(document.getElementById("summary"), kv([
      ["id", String(job.id)],
      ["share", job.share],
      ["state", job.state + (job.reason ? " " + job.reason : "")],
      ["detail", job.detail],
      ["pending reason", waiting ? job.pending_reason : null],
      ["waiting for", waiting ? job.waiting_for : null],
      ["position", waiting && job.position_in_share !== null ? job.position_in_share + " in its share, " + job.position_in_queue + " in the queue" : null],
      ["waiting since", waiting && job.waiting_since !== null ? job.waiting_since_text + " (" + job.pending_text + ")" : null],
      ["forecast", job.forecast_words],
      [waiting ? "last placed on" : "placed on", job.instance_type ? job.count + "× " + job.instance_type + (job.training_plan ? " (plan " + job.training_plan + ")" : "") : null],
      ["preferences", job.preferences.map((p) => p.count + "× " + p.instance_type + (p.training_plan ? " (plan " + p.training_plan + ")" : "")).join(" → ")],
      ["attempts", String(job.attempts)],
      ["preemptions", String(job.preemptions)],
      ["waited", job.waited_text],  // a waiting job's current wait included, as "waiting since" says
      ["GPU-hours", number(job.gpu_hours, 3) + " (" + number(job.lost_gpu_hours, 3) + " lost)"],
      ["cost", money(job.cost)],
      ["backend", job.backend],
      ["submitted", job.submitted_at_text],
      ["Airflow task", job.task_url ? h("a", {href: job.task_url, target: "_top"}, job.dag_id + " / " + job.task_id + (job.map_index === null || job.map_index === undefined ? "" : " [" + job.map_index + "]")) : null],
    ]));
    fill(document.getElementById("attempts"), table(["#", "on", ["borrowed when placed", {class: "num"}], "status", "placed", "running since", "ended", "why it ended"],
      detail.attempts.map((a) => h("tr", {dataset: {attempt: a.number}},
        h("td", {class: "num"}, String(a.number)),
        h("td", {}, a.count + "× " + a.instance_type + (a.training_plan ? " (plan " + a.training_plan + ")" : "")),
        h("td", {class: "num"}, String(a.borrowed)),
        h("td", {}, a.status),
        h("td", {}, a.placed_at_text),
        h("td", {}, a.running_since_text || ""),
        h("td", {}, a.ended_at_text || ""),
        h("td", {class: "wrap", dataset: {role: "why-ended"}}, a.why_ended || "",
          a.reason && !(a.why_ended || "").startsWith(a.reason) ? h("span", {class: "muted", dataset: {role: "raw-reason"}}, " (" + a.reason + ")") : null))),
      "Not placed yet."));
    fill(document.getElementById("preempted"),
      h("h3", {}, "Suffered"),
      table(["when", "by", "kind", ["attempt", {class: "num"}], "was on", ["work lost", {class: "num"}]], preemptionRows(detail.preemptions, true), "Never preempted."),
      h("h3", {}, "Caused"),
      table(["when", "victim", "kind", ["attempt", {class: "num"}], "was on", ["work lost", {class: "num"}]], preemptionRows(detail.caused, false), "Preempted nobody."));
    fill(document.getElementById("job-alerts"), table(["alert", "reason", "raised", "open"],
      detail.alerts.map((a) => h("tr", {}, h("td", {class: "alert-kind"}, a.kind), h("td", {class: "wrap"}, a.reason), h("td", {}, a.at_text), h("td", {}, a.open ? "open" : "closed"))),
      "No alerts."));
    document.getElementById("story").textContent = detail.story.join("\n") || "Nothing decided yet.";
    document.body.dataset.loaded = String(Date.now());
    return detail.now_text;
  }

  tick = poll(refresh);
})();
