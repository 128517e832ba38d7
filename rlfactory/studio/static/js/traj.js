// Trajectory viewer: a step's groups side by side (filter, search), one trajectory token by token.
// Keys: j / k next / previous trajectory, ← / → previous / next token, [ / ] previous / next step,
// / search, Esc close the trajectory.
import { api, h, fmt, badge, qs, onKeys, debounce, errorBox } from "./util.js";

export async function trajectoriesTab(body, runId, steps, params) {
  if (!steps.length) { body.append(h("div", { class: "panel" }, "This run logged no trajectories (trainer.log_trajectories).")); return; }
  let step = Number(params.get("step")) || steps[steps.length - 1];
  if (!steps.includes(step)) step = steps.reduce((a, b) => Math.abs(b - step) < Math.abs(a - step) ? b : a);
  const stepSel = h("select", { id: "step-select", "aria-label": "step" }, steps.map(s => h("option", { value: s, selected: s === step }, `step ${s}`)));
  const status = h("select", { id: "f-status", "aria-label": "status" }, ["", "ok", "truncated", "malformed", "infra_error"].map(s => h("option", { value: s }, s || "any status")));
  const minR = h("input", { id: "f-min", type: "number", step: "any", placeholder: "min", style: { width: "80px" } });
  const maxR = h("input", { id: "f-max", type: "number", step: "any", placeholder: "max", style: { width: "80px" } });
  const toolErr = h("input", { id: "f-toolerr", type: "checkbox" });
  const search = h("input", { id: "f-text", type: "search", placeholder: "text in any segment", style: { width: "220px" } });
  const count = h("span", { class: "muted", id: "step-count" });
  const groupsEl = h("div", { id: "groups" });
  const detail = h("div", { id: "traj-detail" });
  body.append(
    h("div", { class: "panel filters" },
      h("label", {}, "step", h("div", { class: "row" }, h("button", { onclick: () => move(-1), title: "[" }, "◀"), stepSel, h("button", { onclick: () => move(1), title: "]" }, "▶"))),
      h("label", {}, "status", status), h("label", {}, "reward from", minR), h("label", {}, "to", maxR),
      h("label", { class: "inline" }, toolErr, "with tool errors"), h("label", {}, "search", search), count,
      h("span", { class: "keys grow", style: { textAlign: "right" } }, h("kbd", {}, "j"), "/", h("kbd", {}, "k"), " trajectory  ",
        h("kbd", {}, "←"), "/", h("kbd", {}, "→"), " token  ", h("kbd", {}, "["), "/", h("kbd", {}, "]"), " step  ", h("kbd", {}, "/"), " search")),
    groupsEl, detail);
  let order = [], current = null, viewer = null;

  const load = async () => {
    const d = await api(`/api/run/step?${qs({ run: runId, step, status: status.value, min_reward: minR.value,
      max_reward: maxR.value, tool_errors: toolErr.checked ? "1" : "", q: search.value })}`);
    count.textContent = `${d.shown} of ${d.count} trajectories, ${d.groups.length} groups`;
    order = [];
    groupsEl.replaceChildren(...d.groups.map(g => h("div", { class: "group" },
      h("div", { class: "gname", title: g.group }, g.group),
      h("div", { class: "members" }, g.members.map(m => { order.push(m.index); return memberCard(m, () => open(m.index)); })))));
    if (!d.groups.length) groupsEl.append(h("div", { class: "panel muted" }, "No trajectory matches these filters."));
    const want = Number(params.get("i"));
    if (current === null && params.get("i") !== null && order.includes(want)) open(want);
    else if (current !== null && order.includes(current)) mark(current);
  };
  const mark = i => { for (const c of groupsEl.querySelectorAll(".member")) c.classList.toggle("selected", Number(c.dataset.index) === i); };
  const open = async i => {
    current = i; mark(i);
    detail.replaceChildren(h("div", { class: "panel muted" }, "loading…"));
    try {
      const view = await api(`/api/run/trajectory?${qs({ run: runId, step, index: i })}`);
      viewer = renderTrajectory(view);
      detail.replaceChildren(viewer.el);
      // the detail sits below every group's cards: bring it into view (scroll-margin keeps it clear of
      // the top bar), measured in the next frame's layout rather than forcing one now
      requestAnimationFrame(() => {
        const top = detail.getBoundingClientRect().top;
        if (top < 60 || top > window.innerHeight - 120) detail.scrollIntoView({ block: "start" });
      });
      history.replaceState(null, "", `#/run/${encodeURIComponent(runId)}?tab=traj&step=${step}&i=${i}`);
    } catch (e) { detail.replaceChildren(errorBox(e)); }
  };
  const move = dir => {
    const k = steps.indexOf(step) + dir;
    if (k < 0 || k >= steps.length) return;
    step = steps[k]; stepSel.value = String(step); current = null; detail.replaceChildren(); load();
  };
  stepSel.addEventListener("change", () => { step = Number(stepSel.value); current = null; detail.replaceChildren(); load(); });
  for (const el of [status, toolErr]) el.addEventListener("change", load);
  for (const el of [minR, maxR, search]) el.addEventListener("input", debounce(load, 250));
  onKeys(ev => {
    if (ev.key === "Escape") { if (document.activeElement) document.activeElement.blur(); current = null; viewer = null; detail.replaceChildren(); mark(-1); return; }
    if (ev.key === "/") { ev.preventDefault(); search.focus(); return; }
    if (ev.key === "[" || ev.key === "]") { move(ev.key === "]" ? 1 : -1); return; }
    if (ev.key === "j" || ev.key === "k") {
      if (!order.length) return;
      const pos = current === null ? -1 : order.indexOf(current);
      const next = ev.key === "j" ? Math.min(order.length - 1, pos + 1) : Math.max(0, pos - 1);
      open(order[next]);
      return;
    }
    if ((ev.key === "ArrowRight" || ev.key === "ArrowLeft") && viewer) { ev.preventDefault(); viewer.step(ev.key === "ArrowRight" ? 1 : -1); }
  });
  await load();
}

function memberCard(m, onclick) {
  return h("div", { class: "member", dataset: { index: m.index, status: m.status }, tabindex: 0, onclick,
    onkeydown: ev => { if (ev.key === "Enter") onclick(); } },
    h("div", { class: "row", style: { gap: "6px" } }, badge(m.status), h("span", { class: "muted" }, m.id)),
    h("div", { class: "nums" }, h("span", {}, "reward ", h("b", {}, fmt(m.reward))), h("span", {}, "adv ", h("b", {}, fmt(m.advantage))),
      h("span", {}, `${m.turns} turns`), h("span", { style: m.tool_errors ? { color: "var(--bad)" } : {} }, `${m.tool_calls} calls${m.tool_errors ? `, ${m.tool_errors} err` : ""}`)),
    h("div", { class: "preview", title: "the end of the model's text" }, h("span", {}, m.answer_preview || "(no model text)")));
}

// One trajectory. Returns {el, step(dir)}: `step` moves the token cursor.
export function renderTrajectory(view, { live = false } = {}) {
  const flat = [];
  let cursor = -1;
  const inspector = h("div", { class: "panel inspector", id: "token-inspector" },
    h("div", { class: "muted" }, "Hover a token (or ← / →) to see its id, the sampler's and the trainer's logprob."));
  const colorSel = h("select", { id: "color-by" }, [["", "plain"], ["lp", "colour by sampler logprob"], ["diff", "colour by trainer − sampler"]]
    .map(([v, t]) => h("option", { value: v }, t)));
  const show = i => {
    if (i < 0 || i >= flat.length) return;
    if (cursor >= 0 && flat[cursor]) flat[cursor].span.classList.remove("cur");
    cursor = i;
    const { span, row, role, pos } = flat[i];
    span.classList.add("cur");
    const [id, text, lp, tlp] = row;
    const diff = lp !== null && tlp !== null ? tlp - lp : null;
    inspector.replaceChildren(h("h3", { style: { marginTop: 0 } }, "Token"),
      h("div", { class: "tokbox" }, JSON.stringify(text === null ? `⟨${id}⟩` : text)),
      h("div", { class: "kv", style: { marginTop: "6px" } },
        h("b", {}, "token id"), h("span", { id: "ti-id" }, String(id)),
        h("b", {}, "segment"), h("span", {}, `${role} · position ${pos}`),
        h("b", {}, "in the loss"), h("span", {}, role === "model" ? "yes (model token)" : "no (masked)"),
        h("b", {}, "sampler logprob"), h("span", { id: "ti-sampler" }, lp === null ? "–" : lp.toFixed(4)),
        h("b", {}, "trainer logprob"), h("span", { id: "ti-trainer" }, tlp === null ? "–" : tlp.toFixed(4)),
        h("b", {}, "difference"), h("span", { id: "ti-diff" }, diff === null ? "–" : diff.toFixed(4)),
        h("b", {}, "probability"), h("span", {}, lp === null ? "–" : Math.exp(lp).toFixed(4))));
    if (!isVisible(span)) span.scrollIntoView({ block: "center" });
  };
  const recolor = () => {
    for (const t of flat) {
      const [, , lp, tlp] = t.row;
      let bg = "";
      if (t.role === "model" && colorSel.value === "lp" && lp !== null) bg = `rgba(47,95,208,${Math.min(0.75, 0.08 + Math.exp(lp) * 0.7)})`;
      if (t.role === "model" && colorSel.value === "diff" && lp !== null && tlp !== null) {
        const d = Math.min(1, Math.abs(tlp - lp) * 5);
        bg = tlp >= lp ? `rgba(22,128,60,${0.1 + d * 0.6})` : `rgba(192,38,45,${0.1 + d * 0.6})`;
      }
      t.span.style.background = bg;
    }
  };
  const legend = h("div", { class: "color-legend", id: "color-legend" });
  const swatch = (bg, label, extra = {}) => h("span", { class: "sw" }, h("i", { style: { background: bg, ...extra } }), label);
  const paintLegend = () => legend.replaceChildren(...({
    "": [swatch("var(--model)", "model token (in the loss)", { boxShadow: "inset 0 -2px 0 #9db7f5" }), swatch("var(--obs)", "observation (masked)"),
      swatch("var(--prompt)", "prompt (masked)", { border: "1px solid var(--line)" })],
    lp: [h("span", {}, "sampler probability of each model token: "), swatch("rgba(47,95,208,0.08)", "0"), swatch("rgba(47,95,208,0.43)", "0.5"),
      swatch("rgba(47,95,208,0.78)", "1")],
    diff: [h("span", {}, "trainer − sampler logprob: "), swatch("rgba(192,38,45,0.7)", "trainer lower"), swatch("rgba(22,128,60,0.7)", "trainer higher"),
      h("span", { class: "muted" }, "(stronger = larger gap, full at 0.2 nats)")],
  })[colorSel.value]);
  paintLegend();
  colorSel.addEventListener("change", () => { recolor(); paintLegend(); });
  const segEls = [];
  const addSegment = (seg, k) => {
    const role = seg.role;
    const cls = role === "model" ? "m" : role === "observation" ? "o" : "p";
    const tokensEl = h("div", { class: "tokens" });
    const render = () => {
      for (let j = 0; j < seg.tokens.length; j++) {
        const row = seg.tokens[j];
        const text = row[1] === null ? `⟨${row[0]}⟩` : row[1];
        const span = h("span", { class: `tok ${cls}` }, text.replace(/\n/g, "↵\n"));
        const idx = flat.length;
        flat.push({ span, row, role, pos: j });
        span.addEventListener("mouseenter", () => show(idx));
        tokensEl.append(span);
      }
    };
    const lps = seg.tokens.map(r => r[2]).filter(x => x !== null);
    const head = h("div", { class: "seghead" }, h("b", {}, role), h("span", {}, `${seg.tokens.length} tokens`),
      role === "model" ? h("span", {}, `policy v${seg.policy_version ?? "?"} · mean sampler logprob ${fmt(lps.reduce((a, b) => a + b, 0) / (lps.length || 1))}`) : null,
      h("span", {}, role !== "model" ? "not in the loss" : "in the loss"),
      role === "model" && seg.reward !== null && seg.reward !== undefined ? h("span", { class: "turn-reward" }, "turn reward ",
        h("b", {}, fmt(seg.reward, 4)), ` (${Object.entries(seg.reward_terms || {}).map(([k, v]) => `${k} ${fmt(v, 4)}`).join(", ")})`) : null);
    const el = h("div", { class: `seg ${role}`, dataset: { role } }, head, tokensEl, segImages(seg.images, view.run));
    if (role === "prompt" && seg.tokens.length > 80 && !live) {
      const tail = seg.text.slice(-400);
      tokensEl.append(h("span", { class: "muted" }, "… " + tail));
      head.append(h("a", { href: "#", onclick: ev => { ev.preventDefault(); tokensEl.replaceChildren(); const before = flat.length;
        render(); moveTokens(before, seg.tokens.length); ev.target.remove(); } }, "show the prompt's tokens"));
    } else render();
    segEls.push(el);
    return el;
  };
  // Prompt tokens shown late go first in the token order.
  const moveTokens = (from, n) => { const moved = flat.splice(from, n); flat.unshift(...moved); rebind(); };
  const rebind = () => flat.forEach((t, i) => { t.span.onmouseenter = () => show(i); });
  const segs = h("div", { id: "segments" });
  (view.segments || []).forEach((s, k) => segs.append(addSegment(s, k)));
  rebind();
  const info = view.info || {};
  const refs = info.golden_answers || info.answer || (info.reward_model && info.reward_model.ground_truth && info.reward_model.ground_truth.target);
  const terms = Object.entries(view.reward_terms || {});
  const calls = view.tool_calls || [];
  const el = h("div", { class: "traj", dataset: { id: view.id || "" } },
    h("div", {},
      h("div", { class: "panel" },
        h("div", { class: "row" }, h("h2", { style: { margin: 0 } }, view.id || "trajectory"), badge(view.status || "?"),
          h("span", {}, "reward ", h("b", { id: "traj-reward" }, fmt(view.reward))), h("span", {}, "advantage ", h("b", {}, fmt(view.advantage))),
          h("span", {}, `${view.turns ?? "?"} turns`), h("span", { class: "grow" }), colorSel),
        legend,
        view.error ? h("div", { class: "error-box", style: { marginTop: "8px" } }, `why ${view.status}: ${view.error}`) : null,
        info.question ? h("div", { style: { marginTop: "8px" } }, h("b", {}, "question "), info.question) : null,
        refs ? h("div", {}, h("b", {}, "reference "), JSON.stringify(refs)) : null,
        view.decoded === false ? h("div", { class: "muted" }, "No tokenizer found for this run: tokens are shown by id.") : null),
      terms.length ? h("div", { class: "panel" }, h("h3", { style: { marginTop: 0 } }, "Reward terms"),
        h("table", { id: "reward-terms" }, h("tbody", {}, terms.map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", { class: "num" }, fmt(v, 4))))))) : null,
      calls.length ? h("div", { class: "panel" }, h("h3", { style: { marginTop: 0 } }, "Tool calls"),
        h("table", { id: "tool-calls" }, h("thead", {}, h("tr", {}, ["turn", "tool", "arguments", "status", "latency", "cache"].map(t => h("th", {}, t)))),
          h("tbody", {}, calls.map(c => h("tr", {}, h("td", {}, c.turn), h("td", {}, c.name || "(unparsed)"),
            h("td", { class: "cell" }, JSON.stringify(c.arguments)), h("td", {}, badge(c.status), c.error ? h("div", { class: "muted cell" }, c.error) : null),
            h("td", { class: "num" }, `${(c.latency_s * 1000).toFixed(1)} ms`), h("td", {}, c.cached ? "hit" : "miss")))))) : null,
      segs),
    inspector);
  return {
    el,
    step: dir => { show(cursor < 0 ? (dir > 0 ? firstModel() : flat.length - 1) : Math.max(0, Math.min(flat.length - 1, cursor + dir))); },
    addSegment: seg => { const s = addSegment(seg); segs.append(s); rebind(); return s; },
  };
  function firstModel() { const i = flat.findIndex(t => t.role === "model"); return i < 0 ? 0 : i; }
}

// The pictures a prompt or observation segment's image pads stand for, in order: each one's `src`
// where the view carries its bytes (a playground rollout), else from the run's trajectories/images/
// (a live view with no run shows each one's size only).
const IMAGE_EXT = { "image/png": "png", "image/jpeg": "jpg" };
const DATA_IMAGE = /^data:image\/(png|jpeg);base64,/;
function segImages(images, runId) {
  if (!images || !images.length) return null;
  return h("div", { class: "seg-images" }, images.map((im, k) => {
    const label = `image ${k + 1}: ${im.width}×${im.height} px, ${im.mime}, sha256 ${String(im.sha256).slice(0, 12)}`;
    const ext = IMAGE_EXT[im.mime];
    const src = typeof im.src === "string" && DATA_IMAGE.test(im.src) ? im.src
      : runId && ext ? `/api/run/image?${qs({ run: runId, name: `${im.sha256}.${ext}` })}` : null;
    if (!src) return h("span", { class: "muted seg-image-missing" }, `[${label}]`);
    return h("figure", { class: "seg-image" },
      h("img", { src, alt: label, title: label, width: im.width, height: im.height }),
      h("figcaption", { class: "muted" }, `${im.width}×${im.height}`));
  }));
}

function isVisible(el) {
  const r = el.getBoundingClientRect();
  return r.top >= 60 && r.bottom <= window.innerHeight;
}
