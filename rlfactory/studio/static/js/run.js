// One run: live metrics (server-sent events append what metrics.jsonl gains), trajectories, config.
import { api, h, fmt, badge, qs, listen, toast, errorBox, count } from "./util.js";
import { LineChart } from "./chart.js";
import { trajectoriesTab } from "./traj.js";
import { chartBar } from "./chart_tools.js";
import { relativeTimes } from "./chart_math.js";
import { changesTab } from "./changes.js";
import { stopButton } from "./run_actions.js";

const CHARTS = [
  { title: "Reward", match: k => k.startsWith("reward/") && k !== "reward/std", eval: k => k === "reward/mean" },
  { title: "Accuracy", match: k => k === "accuracy", eval: k => k === "accuracy" },
  { title: "KL and logprob mismatch", match: k => ["policy/approx_kl", "policy/kl", "mismatch/kl", "mismatch/abs_diff"].includes(k) },
  { title: "Entropy", match: k => k === "policy/entropy" },
  { title: "Clip fraction", match: k => k === "policy/clipfrac" },
  { title: "Grad norm", match: k => k === "optim/grad_norm" },
  { title: "Tokens / s", match: k => k === "perf/gen_tokens_per_s" || k === "perf/train_tokens_per_s" },
  { title: "Step time split (s)", match: k => ["time/rollout_s", "time/traj_gen_s", "time/traj_tool_s", "time/score_s", "time/train_s"].includes(k) },
  { title: "Tool calls", match: k => k === "traj/tool_calls" || /^tool\/.+\/calls$/.test(k) },
  { title: "Tool errors and timeouts", match: k => k === "tools/error_rate" || /^tool\/.+\/(errors|timeouts)$/.test(k) },
  { title: "Tool latency (s)", match: k => /^time\/tool\/.+\/latency_s$/.test(k) },
  { title: "Statuses per step", match: k => k.startsWith("status/") },
  { title: "Policy loss", match: k => k === "loss/policy" || k === "loss/value" },
  { title: "Tokens per trajectory", match: k => k === "traj/tokens" || k === "traj/model_tokens" },
  { title: "System: CPU (% of one core)", match: k => k === "system/cpu_percent" },
  { title: "System: memory (MB)", match: k => k === "system/rss_mb" || k === "system/gpu_mem_mb" || k === "system/gpu_mem_reserved_mb" },
  { title: "System: GPU utilisation (%)", match: k => k === "system/gpu_util" },
  { title: "System: host memory in use (%)", match: k => k === "system/host_mem_percent" },
];

export async function runPage(app, runId, params) {
  const info = await api(`/api/run?${qs({ run: runId })}`);
  const tab = params.get("tab") || "metrics";
  const statusEl = h("span", { id: "run-status" }, badge(info.summary.status));
  const reasonEl = h("div", { class: "error-box", id: "run-reason" });
  const actions = h("span", { class: "row" });
  const head = h("div", { class: "row" }, h("h1", { style: { margin: 0 } }, runId), statusEl,
    h("span", { class: "muted", id: "run-summary" }, summaryText(info.summary)), h("span", { class: "grow" }), actions);
  const link = t => `#/run/${encodeURIComponent(runId)}?tab=${t}`;
  const tabs = h("div", { class: "tabs" }, [["metrics", "Live metrics"], ["traj", "Trajectories"], ["changes", "What changed"], ["config", "Config"]]
    .map(([t, label]) => h("a", { href: link(t), class: t === tab ? "active" : "", id: `tab-${t}` }, label)));
  const body = h("div");
  app.append(head, tabs, body);
  // One Stop button while the run runs: status events (the live stream sends one on connect) call
  // setActions again, and a new button would lose what its job lookup filled in (its title, its
  // state, "stopping…") until the lookup answered again.
  let stop = null;
  const setActions = summary => {
    stop = summary.status === "running" ? stop || stopButton(runId) : null;
    actions.replaceChildren();
    statusEl.replaceChildren(badge(summary.status));
    statusEl.title = summary.status_reason;
    // a failed run says why where it is seen (a launch that failed at start has nothing else to show)
    reasonEl.textContent = summary.status === "failed" && summary.status_reason ? summary.status_reason : "";
    reasonEl.style.display = reasonEl.textContent ? "" : "none";
    if (stop) actions.append(stop);
    if (summary.status !== "running" && summary.steps_total && summary.steps_done < summary.steps_total) {
      actions.append(h("button", { id: "resume", onclick: () => resume(false) }, "Resume"));
    }
  };
  // Resume; when that would start over and delete the run's logs, the server answers 409 with the
  // command line's own refusal, shown here until the user confirms (then `--restart`).
  const confirmBox = h("div", { id: "resume-confirm" });
  const resume = async restart => {
    try {
      const r = await api("/api/run/resume", { run: runId, restart });
      toast(`resumed: job ${r.job.id}`); location.hash = `#/new?job=${r.job.id}`;
    } catch (e) {
      if (e.status !== 409) { toast(e.message); return; }
      confirmBox.replaceChildren(h("div", { class: "error-box", role: "alertdialog" }, h("div", { id: "resume-refusal" }, e.message),
        h("div", { class: "row", style: { marginTop: "8px" } },
          h("button", { class: "danger", id: "confirm-restart", onclick: () => { confirmBox.replaceChildren(); resume(true); } }, "Start over (delete it)"),
          h("button", { id: "cancel-restart", onclick: () => confirmBox.replaceChildren() }, "Cancel"))));
    }
  };
  app.insertBefore(confirmBox, tabs);
  app.insertBefore(reasonEl, confirmBox);
  setActions(info.summary);
  if (tab === "config") {
    body.append(h("div", { class: "panel" }, h("pre", { class: "mono" }, info.config || "(no config.yaml)")));
    return;
  }
  if (tab === "changes") {
    await changesTab(body, runId, info.steps, params);
    return;
  }
  if (tab === "traj") {
    await trajectoriesTab(body, runId, info.steps, params);
    return;
  }
  await metricsTab(body, runId, info, setActions);
}

function summaryText(s) {
  return `${s.model} · ${s.env} · ${s.algorithm} · step ${s.steps_done}${s.steps_total ? " / " + s.steps_total : ""}`;
}

async function metricsTab(body, runId, info, setActions) {
  const m = await api(`/api/run/metrics?${qs({ run: runId })}`);
  const pick = step => {
    const steps = info.steps;
    if (!steps.length) { toast("this run logged no trajectories"); return; }
    const near = steps.reduce((a, b) => Math.abs(b - step) < Math.abs(a - step) ? b : a);
    location.hash = `#/run/${encodeURIComponent(runId)}?tab=traj&step=${near}`;
  };
  const charts = CHARTS.map(spec => ({ spec, chart: new LineChart(spec.title, { onPick: pick }) }));
  const grid = h("div", { class: "charts", id: "charts" });
  const note = h("div", { class: "muted", id: "metrics-note", style: { marginBottom: "8px" } });
  const anySel = h("select", { id: "any-metric" }, h("option", { value: "" }, "another metric…"));
  const anyChart = new LineChart("(pick a metric)", { onPick: pick });
  const bar = chartBar(() => [...charts.map(c => c.chart), anyChart]);
  body.append(bar.el, note, grid, h("h2", {}, "Any metric"), h("div", { class: "row" }, anySel), h("div", { style: { maxWidth: "720px" } }, anyChart.el));
  const train = m.train, evals = m.eval;
  const keys = Object.keys(train.values).filter(k => k !== "wall_time").sort();
  // seconds since the run's first record, for the time axis (eval records: by their wall_time)
  const times = { train: relativeTimes(train.values.wall_time, train.values["time/step_s"]), t0: null };
  times.t0 = (train.values.wall_time || []).find(v => typeof v === "number") ?? null;
  const evalTimes = times.t0 !== null && evals.values.wall_time ? evals.values.wall_time.map(v => typeof v === "number" ? v - times.t0 : null) : null;
  const timeOf = r => typeof r.wall_time === "number" ? r.wall_time - (times.t0 ?? (times.t0 = r.wall_time)) : null;
  for (const k of keys) anySel.append(h("option", { value: k }, k));
  for (const { spec, chart } of charts) {
    const series = keys.filter(spec.match).map(k => ({ name: k, steps: train.steps, values: train.values[k], times: times.train }));
    if (spec.eval) for (const k of Object.keys(evals.values).filter(spec.eval)) {
      series.push({ name: `eval ${k}`, steps: evals.steps, values: evals.values[k], markers: true, times: evalTimes });
    }
    bar.apply(chart);
    chart.setSeries(series);
    if (series.length) grid.append(chart.el);
  }
  anySel.addEventListener("change", () => {
    const k = anySel.value;
    anyChart.el.querySelector(".title span").textContent = k;
    anyChart.setSeries(k ? [{ name: k, steps: train.steps, values: train.values[k], times: times.train }] : []);
  });
  const setNote = () => {
    note.textContent = train.sampled
      ? `${train.steps.length} of the run's steps drawn (an even sample of a long run); live steps are added as they come.`
      : `${count(train.steps.length, "step")}${evals.steps.length ? `, ${count(evals.steps.length, "evaluation")}` : ""}.`;
  };
  setNote();
  const add = (records, kind) => {
    for (const r of records) {
      if (kind === "train") {
        const n = train.steps.length;
        for (const k of Object.keys(r)) {
          if (k === "step" || k === "wall_time" || train.values[k]) continue;
          train.values[k] = new Array(n).fill(null);
          anySel.append(h("option", { value: k }, k));
        }
        train.steps.push(r.step);
        if (times.train) times.train.push(timeOf(r));
        for (const k of Object.keys(train.values)) train.values[k].push(typeof r[k] === "number" ? r[k] : null);
        if (anySel.value && typeof r[anySel.value] === "number") anyChart.append(anySel.value, r.step, r[anySel.value], {}, timeOf(r));
      }
      for (const { spec, chart } of charts) {
        for (const [k, v] of Object.entries(r)) {
          if (k === "step" || typeof v !== "number") continue;
          if (kind === "train" && spec.match(k)) chart.append(k, r.step, v, {}, timeOf(r));
          if (kind === "eval" && spec.eval && spec.eval(k)) chart.append(`eval ${k}`, r.step, v, { markers: true }, timeOf(r));
        }
        if (chart.series.length && !chart.el.isConnected) grid.append(chart.el);
      }
    }
    for (const { chart } of charts) chart.draw();
    anyChart.draw();
  };
  listen(`/api/run/events?${qs({ run: runId, offset: train.end_offset, eval_offset: evals.end_offset })}`, {
    metrics: d => { add(d.train, "train"); add(d.eval, "eval"); setNote(); },
    reset: () => { location.reload(); },
    steps: d => { info.steps = d.steps; },
    status: s => { setActions(s); document.getElementById("run-summary").textContent = summaryText(s); },
  });
}
