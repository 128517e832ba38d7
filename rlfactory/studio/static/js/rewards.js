// Rewards: compose rule terms and weights (built-in or module:function), score a trajectory from a
// run or pasted, see each term; use the result as a config's reward section.
import { api, h, fmt, qs, errorBox } from "./util.js";

export async function rewardsPage(app) {
  const { terms } = await api("/api/rewards/terms");
  const runs = (await api("/api/runs")).runs;
  const rows = terms.map(t => {
    const on = h("input", { type: "checkbox", checked: t.name === "exact_match" || t.name === "format", dataset: { term: t.name } });
    const w = h("input", { type: "number", step: "any", value: t.name === "format" ? 0.1 : 1.0, style: { width: "80px" }, dataset: { weight: t.name } });
    return { name: t.name, on, w, el: h("tr", {}, h("td", {}, h("label", { class: "inline" }, on, h("b", {}, t.name))), h("td", {}, w), h("td", { class: "muted" }, t.doc)) };
  });
  const custom = h("input", { id: "custom-term", placeholder: "module:function", style: { width: "220px" } });
  const customW = h("input", { id: "custom-weight", type: "number", step: "any", value: 1.0, style: { width: "80px" } });
  const answer = h("input", { id: "answer-spec", value: "tag:answer", style: { width: "160px" } });
  const options = h("textarea", { id: "term-options", rows: 2, placeholder: '{"extra_calls": {"budget": 2}}' });
  const runSel = h("select", { id: "pick-run" }, runs.map(r => h("option", { value: r.id }, r.id)));
  const stepSel = h("select", { id: "pick-step" });
  const idx = h("input", { id: "pick-index", type: "number", min: 0, value: 0, style: { width: "70px" } });
  const pasted = h("textarea", { id: "pasted", rows: 3, placeholder: "or paste one trajectory JSON line" });
  const scoreBtn = h("button", { class: "primary", id: "score" }, "Score");
  const out = h("div", { id: "score-result" });
  app.append(h("h1", {}, "Rewards"), h("div", { class: "cols" },
    h("div", {}, h("div", { class: "panel" }, h("h3", { style: { marginTop: 0 } }, "Terms and weights"),
      h("table", {}, h("tbody", {}, rows.map(r => r.el))),
      h("div", { class: "row", style: { marginTop: "8px" } }, h("label", {}, "your own term", custom), h("label", {}, "weight", customW),
        h("label", {}, "answer extractor", answer)),
      h("label", { style: { display: "flex", marginTop: "8px" } }, "per-term options (JSON)", options))),
    h("div", {}, h("div", { class: "panel" }, h("h3", { style: { marginTop: 0 } }, "Trajectory"),
      h("div", { class: "row" }, h("label", {}, "run", runSel), h("label", {}, "step", stepSel), h("label", {}, "index in the step", idx)),
      h("div", { style: { marginTop: "8px" } }, pasted), h("div", { class: "row", style: { marginTop: "8px" } }, scoreBtn)), out)));
  const loadSteps = async () => {
    stepSel.replaceChildren();
    if (!runSel.value) return;
    const info = await api(`/api/run?${qs({ run: runSel.value })}`);
    for (const s of info.steps) stepSel.append(h("option", { value: s }, s));
  };
  runSel.addEventListener("change", loadSteps);
  await loadSteps();
  scoreBtn.addEventListener("click", async () => {
    const chosen = {};
    for (const r of rows) if (r.on.checked) chosen[r.name] = Number(r.w.value);
    if (custom.value.trim()) chosen[custom.value.trim()] = Number(customW.value);
    let opts = null;
    try { opts = options.value.trim() ? JSON.parse(options.value) : null; }
    catch (e) { out.replaceChildren(errorBox(new Error(`reward.options: not valid JSON (${e.message})`))); return; }
    const req = { terms: chosen, options: opts, answer: answer.value.trim() };
    if (pasted.value.trim()) req.trajectory = pasted.value.trim();
    else req.pick = { run: runSel.value, step: Number(stepSel.value), index: Number(idx.value) };
    try {
      const r = await api("/api/rewards/score", req);
      const use = h("button", { id: "use-reward", onclick: () => {
        sessionStorage.setItem("studio.rewardSection", JSON.stringify({ terms: r.weights, ...(opts ? { options: opts } : {}),
          ...(answer.value.trim() !== "tag:answer" ? { answer: answer.value.trim() } : {}) }));
        location.hash = req.pick ? `#/new?source=${encodeURIComponent("run:" + req.pick.run)}` : "#/new";  // that run's config
      } }, "Use as the reward section of a new run");
      out.replaceChildren(h("div", { class: "panel" },
        h("div", { class: "row" }, h("h3", { style: { margin: 0 } }, "Total ", h("span", { id: "score-total" }, fmt(r.total, 4))),
          h("span", { class: "muted" }, `answer: ${JSON.stringify(r.answer)} · references: ${JSON.stringify(r.references)}`)),
        h("table", { id: "score-terms", style: { marginTop: "8px" } },
          h("thead", {}, h("tr", {}, ["term", "value", "weight", "contribution"].map((t, i) => h("th", { class: i ? "num" : "" }, t)))),
          h("tbody", {}, Object.entries(r.terms).map(([k, v]) => h("tr", { dataset: { term: k } }, h("td", {}, k), h("td", { class: "num" }, fmt(v, 4)),
            h("td", { class: "num" }, fmt(r.weights[k] ?? 1, 4)), h("td", { class: "num" }, fmt(r.contributions[k], 4)))))),
        r.logged.reward !== null && r.logged.reward !== undefined ? h("div", { class: "muted", style: { marginTop: "6px" } }, `logged in the run: reward ${fmt(r.logged.reward, 4)}`) : null,
        h("h3", {}, "As config"), h("pre", { class: "mono", id: "reward-yaml" }, r.yaml), use));
    } catch (e) { out.replaceChildren(errorBox(e)); }
  });
}
