// Runs page: every run with its status, config summary, tags and notes. Search, sort by any
// column, edit tags and notes, delete (after a confirmation); tick two or more to compare their
// curves and their configs.
import { api, h, fmt, ago, badge } from "./util.js";
import { compareRuns } from "./runs_compare.js";

const COLUMNS = [  // [header, sort key of a run, numeric]
  ["run", r => r.id], ["status", r => r.status], ["tags", r => (r.tags || []).join(",")], ["model", r => r.model],
  ["env", r => r.env], ["algorithm", r => r.algorithm], ["steps", r => r.steps_done, true], ["reward", r => r.reward, true],
  ["accuracy", r => r.accuracy, true], ["started", r => r.started, true],
];

export async function runsPage(app) {
  const [data, meta] = await Promise.all([api("/api/runs"), api("/api/runs/notes")]);
  app.append(h("h1", {}, "Runs"));
  if (!data.runs.length) {
    app.append(h("div", { class: "panel" }, `No runs in ${data.root} yet. `, h("a", { href: "#/new" }, "Start one"), "."));
    return;
  }
  const runs = data.runs.map(r => ({ ...r, ...(meta.notes[r.id] || { tags: [], notes: "" }) }));
  const chosen = new Set();
  const compareBtn = h("button", { id: "compare", class: "primary", disabled: true }, "Compare selected");
  const keySel = h("select", { id: "compare-key" });
  const compareBox = h("div", { id: "compare-box" });
  const search = h("input", { id: "run-search", type: "search", placeholder: "search runs: name, status, model, env, tags, notes",
    style: { width: "360px" } });
  const shownCount = h("span", { class: "muted", id: "runs-shown" });
  const tbody = h("tbody");
  let sort = { col: "started", desc: true };
  const heads = COLUMNS.map(([name]) => h("th", { class: ["steps", "reward", "accuracy"].includes(name) ? "num sortable" : "sortable",
    dataset: { sort: name }, title: "sort by this column", onclick: () => {
      sort = { col: name, desc: sort.col === name ? !sort.desc : name === "started" };
      draw();
    } }, name));

  const draw = () => {
    const words = search.value.toLowerCase().split(/\s+/).filter(Boolean);
    const [, keyOf, numeric] = COLUMNS.find(c => c[0] === sort.col);
    const order = runs.filter(r => {
      const text = [r.id, r.status, r.model, r.env, r.algorithm, ...(r.tags || []), r.notes].join(" ").toLowerCase();
      return words.every(w => text.includes(w));
    }).sort((x, y) => {
      const a = keyOf(x), b = keyOf(y);
      if (a === b) return 0;
      if (a === null || a === undefined) return 1;  // missing values last either way
      if (b === null || b === undefined) return -1;
      const c = numeric ? a - b : String(a).localeCompare(String(b), undefined, { numeric: true });
      return sort.desc ? -c : c;
    });
    for (const th of heads) {
      th.setAttribute("aria-sort", th.dataset.sort === sort.col ? (sort.desc ? "descending" : "ascending") : "none");
      th.dataset.arrow = th.dataset.sort === sort.col ? (sort.desc ? "▼" : "▲") : "";
    }
    tbody.replaceChildren(...order.map(row));
    shownCount.textContent = order.length === runs.length ? `${runs.length} runs` : `${order.length} of ${runs.length} runs`;
  };

  const row = r => {
    const box = h("input", { type: "checkbox", "aria-label": `select ${r.id}`, checked: chosen.has(r.id), onclick: ev => {
      ev.stopPropagation();
      ev.target.checked ? chosen.add(r.id) : chosen.delete(r.id);
      compareBtn.disabled = chosen.size < 2;
    } });
    const stop = ev => ev.stopPropagation();
    const tr = h("tr", { class: "clickable", dataset: { run: r.id }, onclick: () => { location.hash = `#/run/${encodeURIComponent(r.id)}`; } },
      h("td", { onclick: stop }, box),
      h("td", {}, h("a", { href: `#/run/${encodeURIComponent(r.id)}` }, r.id),
        r.notes ? h("div", { class: "muted run-notes", title: r.notes }, r.notes.split("\n")[0].slice(0, 80)) : null),
      h("td", { title: r.status_reason }, badge(r.status)),
      h("td", { class: "tags" }, (r.tags || []).map(t => h("span", { class: "tag" }, t))),
      h("td", {}, r.model), h("td", {}, r.env), h("td", {}, r.algorithm),
      h("td", { class: "num" }, r.steps_total ? `${r.steps_done} / ${r.steps_total}` : r.steps_done),
      h("td", { class: "num" }, fmt(r.reward)), h("td", { class: "num" }, fmt(r.accuracy)),
      h("td", {}, ago(r.started)),
      h("td", { class: "row-actions", onclick: stop },
        h("button", { class: "chart-btn edit-notes", title: "tags and notes", onclick: () => editNotes(r, tr) }, "tags/notes"),
        h("button", { class: "chart-btn danger delete-run", title: r.status === "running" ? "running: stop it first" : "delete this run",
          disabled: r.status === "running", onclick: () => confirmDelete(r, tr) }, "delete")));
    return tr;
  };

  // One panel under a row at a time (the tags editor or the delete confirmation).
  const under = (tr, panel) => {
    for (const old of tbody.querySelectorAll("tr.under")) old.remove();
    if (!panel) return;
    const cell = h("td", { colspan: String(COLUMNS.length + 2) }, panel);
    tr.after(h("tr", { class: "under" }, cell));
  };

  const editNotes = (r, tr) => {
    const tags = h("input", { id: "tags-input", value: (r.tags || []).join(", "), placeholder: "baseline, lr-sweep", style: { width: "320px" } });
    const notes = h("textarea", { id: "notes-input", rows: 3 }, r.notes || "");
    const msg = h("span", { class: "muted" });
    const save = async () => {
      try {
        const saved = await api("/api/run/notes", { run: r.id, tags: tags.value, notes: notes.value });
        r.tags = saved.tags; r.notes = saved.notes;
        draw();
      } catch (e) { msg.replaceChildren(h("span", { class: "error-box" }, e.message)); }
    };
    under(tr, h("div", { class: "panel", id: "notes-editor" },
      h("div", { class: "row" }, h("label", {}, "tags (comma-separated)", tags)),
      h("label", { style: { display: "flex", marginTop: "6px" } }, "notes", notes),
      h("div", { class: "row", style: { marginTop: "6px" } }, h("button", { class: "primary", id: "notes-save", onclick: save }, "Save"),
        h("button", { onclick: () => under(tr, null) }, "Cancel"), msg,
        h("span", { class: "muted" }, `kept in ${r.id}/studio_notes.json, beside the logs`))));
  };

  const confirmDelete = (r, tr) => {
    const msg = h("div");
    const yes = h("button", { class: "danger", id: "confirm-delete", onclick: async () => {
      yes.disabled = true;
      try {
        await api("/api/run/delete", { run: r.id, confirm: r.id });
        runs.splice(runs.indexOf(r), 1);
        chosen.delete(r.id);
        compareBtn.disabled = chosen.size < 2;
        draw();
      } catch (e) { msg.replaceChildren(h("div", { class: "error-box" }, e.message)); yes.disabled = false; }
    } }, `Delete ${r.id}`);
    under(tr, h("div", { class: "panel", role: "alertdialog", id: "delete-confirm" },
      h("div", {}, h("b", {}, `Delete the run ${r.id}?`), ` Its whole folder goes: metrics, trajectories, checkpoints${
        r.checkpoints && r.checkpoints.length ? ` (${r.checkpoints.length} checkpoint${r.checkpoints.length > 1 ? "s" : ""})` : ""}, config. `,
        "This cannot be undone."),
      h("div", { class: "row", style: { marginTop: "8px" } }, yes, h("button", { id: "cancel-delete", onclick: () => under(tr, null) }, "Cancel")),
      msg));
  };

  search.addEventListener("input", draw);
  app.append(h("div", { class: "row", style: { marginBottom: "8px" } }, search, shownCount),
    h("div", { class: "panel" },
      h("table", { id: "runs-table" }, h("thead", {}, h("tr", {}, h("th", {}, ""), heads, h("th", {}, ""))), tbody),
      h("div", { class: "row", style: { marginTop: "10px" } }, compareBtn, h("label", { class: "inline" }, "metric", keySel),
        h("span", { class: "muted" }, "tick two or more runs"))));
  for (const k of ["reward/mean", "accuracy", "policy/entropy", "mismatch/abs_diff", "traj/tool_calls", "time/step_s",
    "system/cpu_percent", "system/rss_mb"]) {
    keySel.append(h("option", { value: k }, k));
  }
  app.append(compareBox);
  draw();
  const compare = () => compareRuns(compareBox, [...chosen], keySel.value);
  compareBtn.addEventListener("click", compare);
  keySel.addEventListener("change", () => { if (chosen.size >= 2) compare(); });
}
