// Comparing runs: one metric's curves (with the chart view bar) and the config keys that differ.
import { api, h, qs, errorBox } from "./util.js";
import { LineChart } from "./chart.js";
import { chartBar } from "./chart_tools.js";
import { relativeTimes } from "./chart_math.js";

export async function compareRuns(box, ids, key) {
  const chart = new LineChart(`${key}: ${ids.join(" vs ")}`, { height: 260 });
  const bar = chartBar(() => [chart]);
  bar.apply(chart);
  const diffBox = h("div", { class: "panel", id: "config-diff" }, h("span", { class: "muted" }, "comparing configs…"));
  box.replaceChildren(h("div", { class: "panel" }, bar.el, chart.el), diffBox);
  const runs = await Promise.all(ids.map(id => api(`/api/run/metrics?${qs({ run: id })}`)));
  const series = [];
  ids.forEach((id, k) => {
    const m = runs[k];
    const times = relativeTimes(m.train.values.wall_time, m.train.values["time/step_s"]);
    series.push({ name: id, steps: m.train.steps, values: m.train.values[key] || [], times });
    const evalVals = m.eval.values[key];
    if (evalVals) {
      const t0 = (m.train.values.wall_time || []).find(v => typeof v === "number");
      const evalTimes = t0 !== undefined && m.eval.values.wall_time ? m.eval.values.wall_time.map(v => typeof v === "number" ? v - t0 : null) : null;
      series.push({ name: `${id} (eval)`, steps: m.eval.steps, values: evalVals, markers: true, times: evalTimes });
    }
  });
  chart.setSeries(series);
  try {
    const d = await api(`/api/runs/diff?${ids.map(id => `run=${encodeURIComponent(id)}`).join("&")}`);
    diffBox.replaceChildren(configDiff(d));
  } catch (e) { diffBox.replaceChildren(errorBox(e)); }
}

function configDiff(d) {
  const show = v => v === null || v === undefined ? "–" : typeof v === "object" ? JSON.stringify(v) : String(v);
  return h("div", {},
    h("h3", { style: { marginTop: 0 } }, "Config: what differs"),
    d.differ.length ? h("table", { id: "config-diff-table" },
      h("thead", {}, h("tr", {}, h("th", {}, "key"), d.runs.map(r => h("th", {}, r)))),
      h("tbody", {}, d.differ.map(row => h("tr", { dataset: { key: row.key } }, h("td", {}, h("code", {}, row.key)),
        row.values.map(v => h("td", { class: "cell" }, show(v)))))))
      : h("div", {}, "The configs are the same."),
    h("div", { class: "muted", style: { marginTop: "6px" } }, `${d.same} other keys have one value in every run.`));
}
