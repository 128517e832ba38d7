// Data: preview a dataset (parquet / JSON lines; Search-R1's layout column by column), convert a
// JSON-lines or CSV file of questions and answers into Search-R1's parquet layout.
import { api, h, upload, errorBox, toast } from "./util.js";

export async function dataPage(app) {
  const files = (await api("/api/files?kind=data")).files;
  const { template } = await api("/api/data/template");
  const fileSel = h("select", { id: "data-file" }, files.map(f => h("option", { value: f.path }, f.label)));
  const up = h("input", { type: "file", id: "data-upload", accept: ".parquet,.jsonl,.json,.csv" });
  const previewBtn = h("button", { class: "primary", id: "data-preview" }, "Preview");
  const out = h("div", { id: "data-out" });
  const qCol = h("select", { id: "q-col" }), aCol = h("select", { id: "a-col" });
  const tmpl = h("textarea", { id: "template", rows: 5 }, template);
  const source = h("input", { id: "data-source", value: "custom", style: { width: "140px" } });
  const split = h("select", { id: "split" }, ["train", "test"].map(s => h("option", { value: s }, s)));
  const outName = h("input", { id: "out-name", value: "converted", style: { width: "160px" } });
  const convBtn = h("button", { id: "convert" }, "Convert to Search-R1 parquet");
  const convOut = h("div", { id: "convert-out" });
  app.append(h("h1", {}, "Data"),
    h("div", { class: "panel" }, h("div", { class: "row" }, h("label", {}, "dataset", fileSel), h("label", {}, "or upload one", up), previewBtn)),
    out,
    h("div", { class: "panel" }, h("h2", { style: { marginTop: 0 } }, "Convert questions and answers"),
      h("div", { class: "muted" }, "Reads the file chosen above (.jsonl, .json or .csv); answers may be one string or a JSON list. Writes runs/data/NAME.parquet."),
      h("div", { class: "row", style: { marginTop: "8px" } }, h("label", {}, "question column", qCol), h("label", {}, "answer column", aCol),
        h("label", {}, "data_source", source), h("label", {}, "split", split), h("label", {}, "output name", outName)),
      h("label", { style: { display: "flex", marginTop: "8px" } }, "prompt template ({question} is replaced)", tmpl),
      h("div", { class: "row", style: { marginTop: "8px" } }, convBtn), convOut));
  up.addEventListener("change", async () => {
    if (!up.files.length) return;
    try { const r = await upload(up.files[0]); fileSel.append(h("option", { value: r.path, selected: true }, r.label)); toast(`uploaded ${r.label}`); preview(); }
    catch (e) { out.replaceChildren(errorBox(e)); up.value = ""; }
  });
  let asked = 0;
  const preview = async () => {
    const mine = ++asked;
    try {
      const d = await api("/api/data/preview", { path: fileSel.value });
      if (mine !== asked) return;  // a later choice is on its way
      out.replaceChildren(renderPreview(d, "preview"));
      const names = d.columns.map(c => c.name);
      for (const [sel, want] of [[qCol, "question"], [aCol, "answer"]]) {
        sel.replaceChildren(...names.map(n => h("option", { value: n, selected: n === want || (want === "answer" && n === "answers") }, n)));
      }
    } catch (e) { if (mine === asked) out.replaceChildren(errorBox(e)); }
  };
  previewBtn.addEventListener("click", preview);
  fileSel.addEventListener("change", preview);
  convBtn.addEventListener("click", async () => {
    try {
      const d = await api("/api/data/convert", { path: fileSel.value, question_column: qCol.value, answer_column: aCol.value,
        template: tmpl.value, data_source: source.value, split: split.value, name: outName.value });
      convOut.replaceChildren(h("div", { class: "ok-box", id: "convert-ok" }, `wrote ${d.total_rows} rows to ${d.path}`), renderPreview(d, "converted"));
    } catch (e) { convOut.replaceChildren(errorBox(e)); }
  });
  if (files.length) preview();
}

function show(v) {
  if (v === null || v === undefined) return "";
  return typeof v === "string" ? v : JSON.stringify(v, null, 1);
}

function renderPreview(d, id) {
  let row = 0;
  const layout = h("div");
  const drawLayout = () => {
    const r = d.rows[row] || {};
    layout.replaceChildren(h("div", { class: "row" }, h("button", { onclick: () => { row = Math.max(0, row - 1); drawLayout(); } }, "◀"),
      h("span", {}, `row ${row + 1} of ${d.rows.length} shown`), h("button", { onclick: () => { row = Math.min(d.rows.length - 1, row + 1); drawLayout(); } }, "▶")),
      h("table", { class: "searchr1", id: `${id}-layout` }, h("thead", {}, h("tr", {}, ["column", "type", "value"].map(t => h("th", {}, t)))),
        h("tbody", {}, d.columns.map(c => h("tr", { dataset: { column: c.name } }, h("td", {}, h("b", {}, c.name)), h("td", { class: "muted mono" }, c.type),
          h("td", {}, c.name === "prompt" && Array.isArray(r.prompt)
            ? r.prompt.map(m => h("div", { class: "cell" }, h("b", {}, `${m.role}: `), m.content))
            : h("div", { class: "cell" }, show(r[c.name]))))))));
  };
  drawLayout();
  const cols = d.columns.map(c => c.name);
  return h("div", { class: "panel", id: `${id}-panel` },
    h("div", { class: "row" }, h("h3", { style: { margin: 0 } }, d.file), h("span", { class: "muted" }, `${d.format} · ${d.total_rows} rows · ${cols.length} columns`),
      d.searchr1 ? h("span", { class: "badge ok", id: `${id}-searchr1` }, "Search-R1 layout") : null),
    d.searchr1 ? h("div", { style: { marginTop: "8px" } }, h("h3", {}, "Column by column"), layout) : null,
    h("details", { open: !d.searchr1, style: { marginTop: "8px" } }, h("summary", {}, `first ${d.rows.length} rows`),
      h("div", { style: { overflow: "auto" } }, h("table", { id: `${id}-rows` }, h("thead", {}, h("tr", {}, cols.map(c => h("th", {}, c)))),
        h("tbody", {}, d.rows.map(r => h("tr", {}, cols.map(c => h("td", {}, h("div", { class: "cell" }, show(r[c])))))))))));
}
