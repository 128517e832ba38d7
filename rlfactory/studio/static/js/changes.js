// "What changed": one prompt's group at step A beside its group at step B (the prompt matched by
// its tokens), with the group's statistics and every answer, to see what training did to it.
import { api, h, fmt, badge, qs, errorBox } from "./util.js";

const STATS = [
  ["reward_mean", "mean reward"], ["reward_min", "lowest reward"], ["reward_max", "highest reward"],
  ["ok", "share ok"], ["turns_mean", "mean turns"], ["tool_calls_mean", "mean tool calls"],
  ["tool_errors", "tool errors"], ["model_tokens_mean", "mean model tokens"],
];

export async function changesTab(body, runId, steps, params) {
  if (steps.length < 2) {
    body.append(h("div", { class: "panel", id: "chg-none" },
      steps.length ? "This run logged the trajectories of one step only: nothing to compare yet."
        : "This run logged no trajectories (trainer.log_trajectories)."));
    return;
  }
  const near = want => steps.includes(want) ? want : steps.reduce((a, b) => Math.abs(b - want) < Math.abs(a - want) ? b : a);
  let a = near(Number(params.get("a")) || steps[0]);
  let b = near(Number(params.get("b")) || steps[steps.length - 1]);
  let key = params.get("key") || "";
  const stepSel = (id, value) => h("select", { id, "aria-label": id === "chg-a" ? "step A" : "step B" },
    steps.map(s => h("option", { value: s, selected: s === value }, `step ${s}`)));
  const selA = stepSel("chg-a", a), selB = stepSel("chg-b", b);
  const promptSel = h("select", { id: "chg-prompt", "aria-label": "prompt", style: { maxWidth: "560px" } });
  const out = h("div", { id: "chg-out" });
  body.append(h("div", { class: "panel filters" }, h("label", {}, "step A", selA), h("label", {}, "step B", selB),
    h("label", {}, "prompt (rolled out at both steps)", promptSel)), out);

  const load = async () => {
    out.replaceChildren(h("div", { class: "muted" }, "loading…"));
    let d;
    try {
      d = await api(`/api/run/changes?${qs({ run: runId, a, b, key })}`);
    } catch (e) {
      if (key && e.status === 404) { key = ""; return load(); }  // that prompt is not at both of the new steps
      out.replaceChildren(errorBox(e));
      return;
    }
    promptSel.replaceChildren(...d.common.map(c => h("option", { value: c.key, selected: d.picked && c.key === d.picked.key },
      `${c.label.slice(0, 90)} · reward ${fmt(c.reward_a)} → ${fmt(c.reward_b)}`)));
    history.replaceState(null, "", `#/run/${encodeURIComponent(runId)}?${qs({ tab: "changes", a, b, key: d.picked ? d.picked.key : "" })}`);
    if (!d.picked) {
      out.replaceChildren(h("div", { class: "panel", id: "chg-none" },
        `No prompt of step ${a} was rolled out again at step ${b} (step ${a}: ${d.only_a} prompts, step ${b}: ${d.only_b}). `,
        "Prompts come back once the sampler has gone through the dataset: pick other steps."));
      return;
    }
    out.replaceChildren(render(runId, d));
  };
  selA.addEventListener("change", () => { a = Number(selA.value); load(); });
  selB.addEventListener("change", () => { b = Number(selB.value); load(); });
  promptSel.addEventListener("change", () => { key = promptSel.value; load(); });
  await load();
}

function render(runId, d) {
  const p = d.picked;
  const delta = (x, y) => (typeof x === "number" && typeof y === "number") ? y - x : null;
  const signed = v => v === null ? "–" : (v > 0 ? "+" : "") + fmt(v);
  const stats = h("table", { id: "chg-stats" },
    h("thead", {}, h("tr", {}, h("th", {}, ""), h("th", { class: "num" }, `step ${d.a}`), h("th", { class: "num" }, `step ${d.b}`),
      h("th", { class: "num" }, "change"))),
    h("tbody", {}, STATS.map(([k, label]) => {
      const x = p.a.stats[k], y = p.b.stats[k], dv = delta(x, y);
      return h("tr", { dataset: { stat: k } }, h("td", {}, label), h("td", { class: "num" }, fmt(x)), h("td", { class: "num" }, fmt(y)),
        h("td", { class: "num", style: dv ? { color: (k === "tool_errors" ? -dv : dv) > 0 ? "var(--ok)" : "var(--bad)" } : {} }, signed(dv)));
    })));
  const side = s => h("div", { class: "chg-side", dataset: { step: s.step } },
    h("h3", {}, `step ${s.step} · group ${s.group}`),
    s.members.map(m => h("div", { class: "panel chg-member", dataset: { index: m.index } },
      h("div", { class: "row", style: { gap: "8px" } }, badge(m.status), h("span", {}, "reward ", h("b", {}, fmt(m.reward))),
        h("span", { class: "muted" }, `${m.turns} turns · ${m.tool_calls} calls${m.tool_errors ? `, ${m.tool_errors} err` : ""}`),
        h("span", { class: "grow" }),
        h("a", { href: `#/run/${encodeURIComponent(runId)}?tab=traj&step=${s.step}&i=${m.index}` }, "open")),
      m.error ? h("div", { class: "error-box", style: { marginTop: "6px" } }, m.error) : null,
      m.transcript.map(t => h("div", { class: `seg ${t.role}` }, h("div", { class: "seghead" }, h("b", {}, t.role)),
        h("div", { class: "tokens" }, t.text + (t.cut ? " …" : "")))))));
  return h("div", { dataset: { key: p.key } },
    h("div", { class: "panel" }, h("div", { class: "muted", style: { marginBottom: "6px" } }, "prompt"),
      h("div", { class: "tokens", id: "chg-question" }, p.question || p.prompt)),
    h("div", { class: "panel" }, stats),
    h("div", { class: "cols" }, side(p.a), side(p.b)));
}
