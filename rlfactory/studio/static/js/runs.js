// Runs page: every run with its status and config summary; pick two or more to compare curves.
import { api, h, fmt, ago, badge, qs } from "./util.js";
import { LineChart } from "./chart.js";

export async function runsPage(app) {
  const data = await api("/api/runs");
  const chosen = new Set();
  const keySel = h("select", { id: "compare-key" });
  const compareBtn = h("button", { id: "compare", class: "primary", disabled: true }, "Compare selected");
  const compareBox = h("div", { id: "compare-box" });
  app.append(h("h1", {}, "Runs"));
  if (!data.runs.length) {
    app.append(h("div", { class: "panel" }, `No runs in ${data.root} yet. `, h("a", { href: "#/new" }, "Start one"), "."));
    return;
  }
  const rows = data.runs.map(r => {
    const box = h("input", { type: "checkbox", "aria-label": `select ${r.id}`, onclick: ev => {
      ev.stopPropagation();
      ev.target.checked ? chosen.add(r.id) : chosen.delete(r.id);
      compareBtn.disabled = chosen.size < 2;
    } });
    return h("tr", { class: "clickable", dataset: { run: r.id }, onclick: () => { location.hash = `#/run/${encodeURIComponent(r.id)}`; } },
      h("td", {}, box),
      h("td", {}, h("a", { href: `#/run/${encodeURIComponent(r.id)}` }, r.id)),
      h("td", { title: r.status_reason }, badge(r.status)),
      h("td", {}, r.model), h("td", {}, r.env), h("td", {}, r.algorithm),
      h("td", { class: "num" }, r.steps_total ? `${r.steps_done} / ${r.steps_total}` : r.steps_done),
      h("td", { class: "num" }, fmt(r.reward)), h("td", { class: "num" }, fmt(r.accuracy)),
      h("td", {}, ago(r.started)));
  });
  app.append(h("div", { class: "panel" },
    h("table", { id: "runs-table" },
      h("thead", {}, h("tr", {}, ["", "run", "status", "model", "env", "algorithm", "steps", "reward", "accuracy", "started"]
        .map((t, i) => h("th", { class: i >= 6 && i <= 8 ? "num" : "" }, t)))),
      h("tbody", {}, rows)),
    h("div", { class: "row", style: { marginTop: "10px" } }, compareBtn, h("label", { class: "inline" }, "metric", keySel),
      h("span", { class: "muted" }, "tick two or more runs"))));
  for (const k of ["reward/mean", "accuracy", "policy/entropy", "mismatch/abs_diff", "traj/tool_calls", "time/step_s"]) {
    keySel.append(h("option", { value: k }, k));
  }
  app.append(compareBox);
  const compare = async () => {
    const key = keySel.value;
    const chart = new LineChart(`${key}: ${[...chosen].join(" vs ")}`, { height: 260 });
    compareBox.replaceChildren(h("div", { class: "panel" }, chart.el));
    const series = [];
    for (const id of chosen) {
      const m = await api(`/api/run/metrics?${qs({ run: id })}`);
      series.push({ name: id, steps: m.train.steps, values: m.train.values[key] || [] });
      const evalVals = m.eval.values[key];
      if (evalVals) series.push({ name: `${id} (eval)`, steps: m.eval.steps, values: evalVals, markers: true });
    }
    chart.setSeries(series);
  };
  compareBtn.addEventListener("click", compare);
  keySel.addEventListener("change", () => { if (chosen.size >= 2) compare(); });
}
