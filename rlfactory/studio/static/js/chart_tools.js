// The chart view bar: one smoothing slider, log scale and x axis for every chart of a page, kept
// in localStorage across pages and reloads (as TensorBoard keeps its smoothing).
import { h } from "./util.js";

const KEY = "rlfactory.chartView";

export function savedView() {
  try {
    const v = JSON.parse(localStorage.getItem(KEY) || "{}");
    return { smooth: Math.min(0.99, Math.max(0, Number(v.smooth) || 0)), logY: v.logY === true,
      xMode: v.xMode === "time" ? "time" : "step" };
  } catch (e) {
    return { smooth: 0, logY: false, xMode: "step" };
  }
}

// charts(): the page's charts now (some are made later); returns {el, apply(chart)}.
export function chartBar(charts) {
  const view = savedView();
  const slider = h("input", { type: "range", id: "smoothing", min: "0", max: "0.99", step: "0.01", value: String(view.smooth),
    "aria-label": "smoothing" });
  const shown = h("output", { id: "smoothing-value" }, view.smooth.toFixed(2));
  const log = h("input", { type: "checkbox", id: "log-y", checked: view.logY });
  const xSel = h("select", { id: "x-axis", "aria-label": "x axis" },
    h("option", { value: "step", selected: view.xMode === "step" }, "step"),
    h("option", { value: "time", selected: view.xMode === "time" }, "wall time (since start)"));
  const unzoom = h("button", { id: "reset-zoom", title: "every chart back to its whole range" }, "reset zoom");
  const update = () => {
    view.smooth = Number(slider.value); view.logY = log.checked; view.xMode = xSel.value;
    shown.textContent = view.smooth.toFixed(2);
    localStorage.setItem(KEY, JSON.stringify(view));
    for (const c of charts()) c.setView(view);
  };
  slider.addEventListener("input", update);
  log.addEventListener("change", update);
  xSel.addEventListener("change", update);
  unzoom.addEventListener("click", () => { for (const c of charts()) c.resetZoom(); });
  const el = h("div", { class: "chart-bar", id: "chart-bar" },
    h("label", { class: "inline", title: "exponential moving average, debiased (as TensorBoard): the raw line stays, faint" },
      "smoothing", slider, shown),
    h("label", { class: "inline" }, log, "log scale"),
    h("label", { class: "inline" }, "x axis", xSel),
    unzoom,
    h("span", { class: "muted" }, "drag on a chart: zoom · Shift+drag: pan · double-click: whole range"));
  return { el, apply: chart => chart.setView(view) };
}
