// Tools: load a tool config (MCP JSON/YAML, RL-Factory pydata, Python module:function), list the
// tools and their schemas, call one from a form built from its schema.
import { api, h, upload, badge, errorBox, toast } from "./util.js";

let session = null;

export async function toolsPage(app) {
  const files = (await api("/api/files?kind=tools")).files;
  const fileSel = h("select", { id: "tool-file" }, h("option", { value: "" }, "(none)"), files.map(f => h("option", { value: f.path }, f.label)));
  const up = h("input", { type: "file", id: "tool-upload", accept: ".json,.yaml,.yml,.pydata" });
  const python = h("input", { id: "tool-python", placeholder: "my_tools:lookup, other:fn", style: { width: "260px" } });
  const loadBtn = h("button", { class: "primary", id: "tool-load" }, "Load tools");
  const status = h("div", { id: "tool-status" });
  const list = h("div", { id: "tool-list" });
  const form = h("div", { id: "tool-form" });
  app.append(h("h1", {}, "Tools"),
    h("div", { class: "panel" }, h("div", { class: "row" }, h("label", {}, "tool config", fileSel), h("label", {}, "or upload one", up),
      h("label", {}, "and/or Python functions", python), loadBtn),
      h("div", { class: "muted", style: { marginTop: "6px" } }, "A run config's tools: section works too. MCP servers start as subprocesses and stay up while this page uses them."), status),
    h("div", { class: "toollist" }, list, form));
  up.addEventListener("change", async () => {
    if (!up.files.length) return;
    try {
      const r = await upload(up.files[0]);
      fileSel.append(h("option", { value: r.path, selected: true }, r.label));
      toast(`uploaded ${r.label}`);
    } catch (e) { status.replaceChildren(errorBox(e)); up.value = ""; }
  });
  loadBtn.addEventListener("click", async () => {
    loadBtn.disabled = true;
    status.replaceChildren(h("div", { class: "muted" }, h("span", { class: "spinner" }), " starting the tools…"));
    try {
      const r = await api("/api/tools/load", { path: fileSel.value || null, python: python.value, previous: session });
      session = r.session;
      status.replaceChildren(h("div", { class: "ok-box" }, `${r.tools.length} tool(s) from ${r.source}`));
      renderList(list, form, r.tools);
    } catch (e) { status.replaceChildren(errorBox(e)); }
    finally { loadBtn.disabled = false; }
  });
}

function renderList(list, form, tools) {
  const items = tools.map(t => h("div", { class: "toolitem", dataset: { tool: t.name }, tabindex: 0 },
    h("b", {}, t.name), h("div", { class: "muted" }, t.server ? `server ${t.server}` : "python"),
    h("div", { class: "muted", style: { fontSize: "12px" } }, (t.description || "").split("\n")[0])));
  items.forEach((el, i) => {
    const pick = () => { items.forEach(x => x.classList.remove("active")); el.classList.add("active"); renderForm(form, tools[i]); };
    el.addEventListener("click", pick);
    el.addEventListener("keydown", ev => { if (ev.key === "Enter") pick(); });
  });
  list.replaceChildren(h("div", { class: "panel" }, items.length ? items : h("div", { class: "muted" }, "no tools")));
  form.replaceChildren(h("div", { class: "panel muted" }, "Pick a tool to call it."));
}

function fieldFor(name, schema, required) {
  const type = Array.isArray(schema.type) ? schema.type.find(t => t !== "null") : schema.type;
  let input;
  if (schema.enum) input = h("select", {}, schema.enum.map(v => h("option", { value: JSON.stringify(v) }, String(v))));
  else if (type === "boolean") input = h("input", { type: "checkbox", checked: schema.default === true });
  else if (type === "integer" || type === "number") input = h("input", { type: "number", step: type === "integer" ? 1 : "any", value: schema.default ?? "" });
  else if (type === "object" || type === "array") input = h("textarea", { rows: 3, placeholder: type === "object" ? "{}" : "[]" }, schema.default !== undefined ? JSON.stringify(schema.default) : "");
  else input = h("input", { type: "text", value: schema.default ?? "" });
  input.name = name;
  input.dataset.type = schema.enum ? "enum" : type || "string";
  const label = h("label", {}, h("span", {}, h("b", {}, name), required ? " *" : "", h("span", { class: "muted" }, ` ${schema.enum ? "enum" : type || "any"}`)),
    input, schema.description ? h("span", { class: "help" }, schema.description) : null);
  return { label, input, name, required };
}

function readField(f) {
  const el = f.input, t = el.dataset.type;
  if (t === "boolean") return el.checked;
  if (el.value === "") return undefined;
  if (t === "enum") return JSON.parse(el.value);
  if (t === "integer" || t === "number") return Number(el.value);
  if (t === "object" || t === "array") return JSON.parse(el.value);
  return el.value;
}

function renderForm(form, tool) {
  const schema = tool.parameters || {};
  const props = schema.properties || {}, req = new Set(schema.required || []);
  const fields = Object.entries(props).map(([n, s]) => fieldFor(n, s, req.has(n)));
  const raw = h("textarea", { rows: 3, id: "tool-raw", placeholder: "or the arguments as JSON (overrides the form)" });
  const callBtn = h("button", { class: "primary", id: "tool-call" }, `Call ${tool.name}`);
  const out = h("div", { id: "tool-result" });
  form.replaceChildren(h("div", { class: "panel" },
    h("h2", { style: { marginTop: 0 } }, tool.name), h("div", { class: "muted", style: { whiteSpace: "pre-wrap" } }, tool.description || ""),
    h("div", { class: "form-grid", style: { marginTop: "10px" } }, fields.map(f => f.label), raw, h("div", {}, callBtn)),
    h("details", { style: { marginTop: "10px" } }, h("summary", {}, "JSON schema"), h("pre", { class: "mono" }, JSON.stringify(schema, null, 2))),
    out));
  callBtn.addEventListener("click", async () => {
    let args = {};
    try {
      if (raw.value.trim()) args = JSON.parse(raw.value);
      else for (const f of fields) { const v = readField(f); if (v !== undefined) args[f.name] = v; }
    } catch (e) { out.replaceChildren(errorBox(new Error(`arguments: not valid JSON (${e.message})`))); return; }
    callBtn.disabled = true;
    out.replaceChildren(h("div", { class: "muted" }, h("span", { class: "spinner" }), " calling…"));
    try {
      const r = await api("/api/tools/call", { session, name: tool.name, arguments: args });
      out.replaceChildren(h("div", { class: "panel", style: { marginTop: "10px" } },
        h("div", { class: "row" }, badge(r.is_error ? (r.status === "ok" ? "error" : r.status) : "ok"), h("span", { id: "tool-latency" }, `${(r.latency_s * 1000).toFixed(1)} ms`),
          r.cached ? h("span", { class: "badge" }, "cached") : null, r.truncated ? h("span", { class: "badge truncated" }, "truncated") : null),
        h("pre", { class: `result ${r.is_error ? "error-box" : ""}`, id: "tool-output" }, r.text),
        r.data !== null && r.data !== undefined ? h("details", {}, h("summary", {}, "structured content"), h("pre", { class: "mono" }, JSON.stringify(r.data, null, 2))) : null));
    } catch (e) { out.replaceChildren(errorBox(e)); }
    finally { callBtn.disabled = false; }
  });
}
