// Playground: pick a model and an env or tool config, ask a question, watch one rollout turn by
// turn (prompt, each model turn with its tokens and logprobs, tool calls and results, observations).
import { api, h, fmt, badge, listen, closeStreams, errorBox } from "./util.js";
import { renderTrajectory } from "./traj.js";

export async function playgroundPage(app) {
  const [{ models }, configs, tools] = await Promise.all([api("/api/models"), api("/api/configs"), api("/api/files?kind=tools")]);
  const model = h("select", { id: "pg-model" }, models.map(m => h("option", { value: m.path }, m.label)));
  const config = h("select", { id: "pg-config" },
    h("optgroup", { label: "run configs (env and tools)" }, configs.examples.map(c => h("option", { value: c.source }, c.label))),
    h("optgroup", { label: "tool configs (a plain prompt env)" }, tools.files.filter(f => !f.label.endsWith(".yaml") || f.label.includes("mcp"))
      .map(f => h("option", { value: f.path }, f.label))));
  const question = h("input", { id: "pg-question", placeholder: "type a question", style: { width: "100%" } });
  const imageIn = h("input", { id: "pg-image", type: "file", accept: "image/png,image/jpeg", "aria-label": "image" });
  const preview = h("img", { id: "pg-image-preview", alt: "the question's image", hidden: true,
    style: { maxHeight: "64px", maxWidth: "160px", imageRendering: "pixelated", border: "1px solid var(--line)" } });
  const clearImage = h("button", { id: "pg-image-clear", type: "button", hidden: true, title: "ask without the image" }, "✕");
  let image = null;  // the chosen file as a data: URL
  const showImage = url => { image = url; preview.hidden = clearImage.hidden = !url; if (url) preview.src = url; else preview.removeAttribute("src"); };
  imageIn.addEventListener("change", () => {
    const file = imageIn.files[0];
    if (!file) { showImage(null); return; }
    const reader = new FileReader();
    reader.onload = () => showImage(reader.result);
    reader.onerror = () => { showImage(null); state.replaceChildren(errorBox(new Error(`image: cannot read ${file.name}`))); };
    reader.readAsDataURL(file);
  });
  clearImage.addEventListener("click", () => { imageIn.value = ""; showImage(null); });
  const answer = h("input", { id: "pg-answer", placeholder: "reference answer (optional: scores the rollout)", style: { width: "280px" } });
  const turns = h("input", { id: "pg-turns", type: "number", min: 1, placeholder: "env's", title: "empty: the env's own limit", style: { width: "70px" } });
  const maxNew = h("input", { id: "pg-max-new", type: "number", min: 1, value: 96, style: { width: "80px" } });
  const temp = h("input", { id: "pg-temp", type: "number", min: 0, step: 0.1, value: 1.0, style: { width: "70px" } });
  const script = h("textarea", { id: "pg-script", rows: 4, placeholder: "Optional: force the model's turns (one per block, blocks separated by a line with ---). Useful to try an env or a tool config with a model that cannot use tools yet." });
  const runBtn = h("button", { class: "primary", id: "pg-run" }, "Run");
  const stopBtn = h("button", { id: "pg-stop", disabled: true }, "Stop");
  const state = h("div", { id: "pg-state", class: "muted" });
  const live = h("div", { id: "pg-live" });
  const turnLog = h("div", { id: "pg-turns-log" });
  app.append(h("h1", {}, "Playground"),
    h("div", { class: "panel" },
      h("div", { class: "row" }, h("label", {}, "model", model), h("label", {}, "env or tool config", config),
        h("label", {}, "max turns", turns), h("label", {}, "max new tokens", maxNew), h("label", {}, "temperature", temp)),
      h("div", { class: "row", style: { marginTop: "8px" } }, h("label", { class: "grow" }, "question", question), h("label", {}, "answer", answer)),
      h("div", { class: "row", style: { marginTop: "8px" } }, h("label", {}, "image (optional, PNG or JPEG: needs a vision-language model)", imageIn),
        preview, clearImage),
      h("details", { style: { marginTop: "8px" } }, h("summary", {}, "scripted turns"), script),
      h("div", { class: "row", style: { marginTop: "10px" } }, runBtn, stopBtn, state)),
    h("div", { class: "pg-cols" }, live, turnLog));
  question.addEventListener("keydown", ev => { if (ev.key === "Enter") runBtn.click(); });
  stopBtn.addEventListener("click", async () => { await api("/api/playground/stop", {}); state.textContent = "stopped"; });
  runBtn.addEventListener("click", async () => {
    closeStreams();
    live.replaceChildren(); turnLog.replaceChildren();
    const blocks = script.value.trim() ? script.value.split(/^---\s*$/m).map(s => s.trim()).filter(Boolean) : [];
    let id;
    try {
      id = (await api("/api/playground/start", { model: model.value, config: config.value, question: question.value, image, answer: answer.value,
        max_turns: turns.value ? Number(turns.value) : null, max_new_tokens: Number(maxNew.value), temperature: Number(temp.value), script: blocks })).id;
    } catch (e) { state.replaceChildren(errorBox(e)); return; }
    runBtn.disabled = true; stopBtn.disabled = false;
    state.replaceChildren(h("span", { class: "spinner" }), " starting…");
    const viewer = renderTrajectory({ id: "rollout in progress", status: "running", segments: [], tool_calls: [] }, { live: true });
    live.append(viewer.el);
    let turn = 0;
    const logEntry = (...c) => turnLog.append(h("div", { class: "panel event" }, ...c));
    const done = () => { runBtn.disabled = false; stopBtn.disabled = true; };
    listen(`/api/playground/events?id=${id}`, {
      status: e => { state.replaceChildren(h("span", { class: "spinner" }), " " + e.message); },
      prompt: e => { viewer.addSegment({ role: "prompt", tokens: e.tokens, text: e.text, images: e.images }); },
      model: e => {
        turn += 1;
        viewer.addSegment({ role: "model", tokens: e.tokens, text: e.text, policy_version: 0 });
        logEntry(h("b", {}, `turn ${turn}: model`), h("span", { class: "muted" }, ` ${e.tokens.length} tokens, ${e.finish_reason}, ${fmt(e.gen_s)} s`),
          h("pre", { class: "mono cell", dataset: { kind: "model" } }, e.text));
      },
      tool_calls: e => logEntry(h("b", {}, "tool calls"), e.calls.map(c => h("pre", { class: "mono cell", dataset: { kind: "call" } }, `${c.name}(${JSON.stringify(c.arguments)})`))),
      tool_results: e => logEntry(h("b", {}, "tool results"), e.results.map(r => h("div", {}, badge(r.is_error ? r.status === "ok" ? "error" : r.status : "ok"),
        ` ${r.name} · ${(r.latency_s * 1000).toFixed(1)} ms`, h("pre", { class: "mono cell", dataset: { kind: "result" } }, r.text)))),
      observation: e => { viewer.addSegment({ role: "observation", tokens: e.tokens, text: e.text, images: e.images }); },
      trajectory: e => {
        const final = renderTrajectory(e.view);
        live.replaceChildren(final.el);
        live.dataset.status = e.view.status;
        state.replaceChildren(h("span", { id: "pg-done" }, `done: `), badge(e.view.status), e.view.reward !== null ? ` reward ${fmt(e.view.reward)}` : "");
      },
      error: e => { state.replaceChildren(errorBox(new Error(e.message))); done(); },
      done: () => { done(); closeStreams(); },
    });
  });
}
