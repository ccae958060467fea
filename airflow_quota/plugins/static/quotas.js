/* The Quotas page: one card per share (capacity bars per instance type, a utilisation chart,
   the queue with positions and pending reasons, running jobs with borrowing badges), open
   alerts and the preemption history. Polls the JSON API every few seconds. */
"use strict";

(function () {
  const {h, fill, api, money, number, code, table, priorityControl, poll, root} = window.Quota;
  const LIVE = ["SUBMITTED", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING"];
  const WAITING = ["SUBMITTED", "RUNNABLE"];
  const CHART_SECONDS = 30;
  const charts = new Map();  // share -> {img, loadedAt}: kept across renders so charts do not flicker
  let tick = null;

  function jobLink(job) {
    return h("a", {href: root + "/jobs/" + job.id, dataset: {jobId: job.id}}, job.name);
  }

  /** The four segments of a type's bar, in instances; they add up to limit + borrowed. */
  function segments(t) {
    const own = Math.min(t.used, t.limit);
    const lent = Math.min(t.lent, t.limit - own);
    const idle = Math.max(0, t.limit - own - lent);
    return [["own", own, "own use"], ["borrowed", t.borrowed, "borrowed from others"], ["lent", lent, "lent to others"], ["idle", idle, "idle"]];
  }

  function typeRow(t) {
    const parts = segments(t);
    const scale = Math.max(t.capacity, t.limit + t.borrowed, 1);
    const label = parts.filter((p) => p[1] > 0).map((p) => number(p[1], p[1] % 1 ? 2 : 0) + " " + p[2]).join(", ") || "nothing";
    const bar = h("div", {class: "bar", role: "img", "aria-label": t.instance_type + ": " + label},
      parts.filter((p) => p[1] > 0).map(([kind, value, title]) =>
        h("span", {class: "seg " + kind, title: title + ": " + value, dataset: {kind, value: String(value)}, style: "width:" + (100 * value / scale) + "%"})),
      t.limit ? h("span", {class: "limit-mark", title: "limit " + t.limit, style: "left:calc(" + (100 * t.limit / scale) + "% - 1px)"}) : null);
    return h("div", {class: "type", dataset: {type: t.instance_type, limit: t.limit, used: t.used, borrowed: t.borrowed, lent: t.lent, idle: t.idle, capacity: t.capacity}},
      h("div", {class: "type-head"},
        h("span", {class: "name"}, t.instance_type, h("span", {class: "muted"}, " · " + t.gpus_per_instance + " GPU each · pool " + t.capacity)),
        h("span", {}, "limit " + t.limit + " · used " + t.used + (t.borrowed ? " (" + t.borrowed + " borrowed)" : "") +
          (t.lent ? " · lent " + number(t.lent, t.lent % 1 ? 2 : 0) : "") + " · idle " + number(parts[3][1], parts[3][1] % 1 ? 2 : 0) +
          (t.runnable ? " · " + t.runnable + " waiting, oldest " + t.oldest_pending_text : ""))),
      bar);
  }

  function chart(share) {
    let entry = charts.get(share.name);
    if (!entry) {
      entry = {img: h("img", {class: "chart", alt: "GPUs held by " + share.name + " over time", dataset: {role: "chart"}}), loadedAt: 0};
      charts.set(share.name, entry);
    }
    const due = Date.now() - entry.loadedAt > CHART_SECONDS * 1000;
    if (due) {
      entry.loadedAt = Date.now();
      entry.img.src = root + "/api/shares/" + encodeURIComponent(share.name) + "/utilisation.svg?hours=24&t=" + entry.loadedAt;
    }
    return entry.img;
  }

  function queueTable(share, jobs) {
    const rows = jobs.flatMap((job) => [h("tr", {dataset: {jobId: job.id, state: job.state}},
      h("td", {class: "num", dataset: {role: "position"}, title: "position in the share / in the whole queue"},
        job.position_in_share === null ? "–" : job.position_in_share + (job.position_in_queue === null ? "" : " / " + job.position_in_queue)),
      h("td", {}, jobLink(job)),
      h("td", {}, priorityControl(job, share.max_priority, () => tick && tick())),
      h("td", {class: "code", dataset: {role: "reason"}}, job.state === "SUBMITTED" ? "SUBMITTED (not taken in yet)" : code(job.pending_reason || "")),
      h("td", {class: "wrap-words"}, job.waiting_for || ""),
      h("td", {class: "num", dataset: job.pending_seconds === null ? {role: "waited"} : {role: "waited", seconds: job.pending_seconds}},
        job.pending_text || "")),
      // the forecast on a line of its own under the job's: the queue keeps its six columns' width
      job.forecast_short ? h("tr", {class: "forecast"},
        h("td", {}, ""),
        h("td", {class: "wrap-words muted", colspan: "5", dataset: {role: "forecast"}, title: job.forecast_words || ""},
          "expected start " + job.forecast_short)) : null].filter(Boolean));
    return table([["#", {class: "num", title: "position in the share / in the whole queue"}], "job", "priority", "pending reason", "waiting for", ["waited", {class: "num"}]], rows, "Nobody waits.");
  }

  function runningTable(share, jobs) {
    const rows = jobs.map((job) => h("tr", {dataset: {jobId: job.id, state: job.state}},
      h("td", {}, jobLink(job)),
      h("td", {class: "wrap-words", dataset: {role: "placement"}}, job.count + "× " + job.instance_type + (job.training_plan ? " (plan " + job.training_plan + ")" : ""),
        job.borrowed ? h("span", {class: "badge borrowing", dataset: {role: "borrowing"}, title: "holds " + job.borrowed + " instance(s) above its share's limit now"}, " borrowing " + job.borrowed) : null),
      h("td", {}, job.state === "RUNNING" ? "RUNNING" : job.state),
      h("td", {}, priorityControl(job, share.max_priority, () => tick && tick())),
      h("td", {class: "num"}, String(job.attempts)),
      h("td", {class: "num"}, money(job.cost))));
    return table(["job", "on", "state", "priority", ["attempt", {class: "num"}], ["cost", {class: "num"}]], rows, "Nothing runs.");
  }

  // When a waiting job of the share may be starving, and why: the words of ShareView.starvation_words
  // (store/views.py), which airflow-quota shares prints, from the API's figures and their texts.
  function starvationLine(share) {
    if (share.starvation_threshold_seconds === null) return "starving after: not known yet (the quota scheduler has not written it since its upgrade)";
    const after = "starving after " + share.starvation_threshold_text;
    if (share.starvation_fixed) return after + " (fixed)";
    if (share.normal_wait_seconds === null || share.starvation_multiple === null) return after + " (normal wait not known yet)";
    const drawn = share.starvation_multiple + "x a normal wait of " + share.normal_wait_text;
    return share.starvation_threshold_seconds > share.starvation_multiple * share.normal_wait_seconds ?
      after + " (the minimum; " + drawn + " is less)" : after + " (" + drawn + ")";
  }

  function shareCard(share, jobs) {
    const waiting = jobs.filter((j) => WAITING.includes(j.state)).sort((a, b) => (a.position_in_share || 1e9) - (b.position_in_share || 1e9) || a.id - b.id);
    const running = jobs.filter((j) => !WAITING.includes(j.state));
    return h("section", {class: "share", dataset: {share: share.name}, "aria-label": "share " + share.name},
      h("div", {class: "share-head"},
        h("h2", {}, share.name),
        h("span", {class: "badge strategy"}, share.strategy + (share.strategy === "LEND_AND_BORROW" && share.borrow_limit !== null ? " " + share.borrow_limit + "%" : "")),
        share.in_share_preemption ? h("span", {class: "badge", dataset: {role: "in-share"}},
          "in-share preemption " + (share.in_share_preemption_after_seconds ? "after " + share.in_share_preemption_after_text : "at once")) : null,
        share.state !== "ENABLED" ? h("span", {class: "badge disabled"}, share.state) : null,
        h("span", {class: "badge"}, "max priority " + share.max_priority)),
      h("div", {class: "stats"},
        h("span", {}, h("b", {}, String(share.running)), " running"),
        h("span", {dataset: {role: "waiting"}}, h("b", {}, String(share.runnable)), " waiting" + (share.runnable ? ", oldest " + share.oldest_pending_text : "")),
        h("span", {}, h("b", {}, number(share.gpu_hours)), " GPU-h"),
        h("span", {dataset: {role: "cost"}}, "cost ", h("b", {}, money(share.cost))),
        h("span", {}, h("b", {}, String(share.preemptions)), " preempted")),
      h("p", {class: "muted starvation", dataset: {role: "starvation"}}, starvationLine(share)),
      share.types.map(typeRow),
      chart(share),
      h("h3", {}, "Queue"),
      h("div", {dataset: {role: "queue"}}, queueTable(share, waiting)),
      h("h3", {}, "Running"),
      h("div", {dataset: {role: "running"}}, runningTable(share, running)));
  }

  function renderShares(answer, jobs) {
    const main = document.getElementById("shares");
    if (!answer.shares.length) {
      fill(main, h("p", {class: "empty"}, "No quota configuration is applied yet (airflow-quota apply quota.yaml)."));
      return;
    }
    fill(main, ...answer.shares.map((share) => shareCard(share, jobs.filter((j) => j.share === share.name))));
  }

  function renderAlerts(answer) {
    const rows = answer.alerts.map((a) => h("tr", {dataset: {alertId: a.id, kind: a.kind}},
      h("td", {class: "alert-kind"}, a.kind),
      h("td", {}, h("a", {href: root + "/jobs/" + a.job_id}, a.job)),
      h("td", {}, a.share),
      h("td", {class: "wrap"}, a.reason),
      h("td", {dataset: {role: "raised", at: a.at}}, a.age_text + " ago")));
    fill(document.querySelector("#alerts .content"), table(["alert", "job", "share", "reason", "raised"], rows, "No open alerts."));
  }

  function renderPreemptions(answer) {
    const rows = answer.preemptions.map((p) => h("tr", {dataset: {preemptionId: p.id, kind: p.kind}},
      h("td", {dataset: {role: "when", at: p.at}}, p.at_text),
      h("td", {dataset: {role: "victim"}}, h("a", {href: root + "/jobs/" + p.job_id}, p.job), h("span", {class: "muted"}, " (" + p.share + ")")),
      h("td", {dataset: {role: "kind"}}, p.kind),
      h("td", {dataset: {role: "preemptor"}}, p.preemptor_id ? h("a", {href: root + "/jobs/" + p.preemptor_id}, p.preemptor) : p.preemptor,
        p.preemptor_share ? h("span", {class: "muted"}, " (" + p.preemptor_share + ")") : null),
      h("td", {}, p.count ? p.count + "× " + p.instance_type : ""),
      h("td", {class: "num"}, "attempt " + p.attempt),
      h("td", {class: "num", dataset: {role: "lost", seconds: p.lost_seconds}}, p.lost_text)));
    fill(document.querySelector("#preemptions .content"),
      table(["when", "job (share)", "kind", "preempted by", "was on", ["attempt", {class: "num"}], ["work lost", {class: "num"}]], rows, "No preemptions yet."));
  }

  function renderScheduler(status) {
    const banner = document.getElementById("scheduler-down");
    banner.hidden = status.running;
    if (status.running) return;
    const last = status.silent_seconds === null
      ? "no quota scheduler has ever led on this database"
      : "its last heartbeat (" + status.leader + ") was " + status.silent_text + " ago";
    fill(banner, h("b", {}, "No quota scheduler is running: "), "waiting jobs will not be placed; " + last +
      ". Start one with airflow-quota scheduler.");
  }

  async function refresh() {
    const [shares, live, preemptions, alerts] = await Promise.all([
      api("/shares"),
      api("/jobs?" + LIVE.map((s) => "state=" + s).join("&")),
      api("/preemptions?limit=25"),
      api("/alerts?open=true"),
    ]);
    renderScheduler(shares.scheduler);
    renderAlerts(alerts);
    renderShares(shares, live.jobs);
    renderPreemptions(preemptions);
    document.body.dataset.loaded = String(Date.now());
    return shares.now_text;
  }

  tick = poll(refresh);
})();
