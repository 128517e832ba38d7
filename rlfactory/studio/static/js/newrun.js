// New run: start from an example or a run's config, edit YAML or add dotted overrides, see the
// command line's validation inline (key, line), launch train / sft / eval, follow the log, stop it.
import { api, h, badge, ago, listen, debounce, errorBox, toast } from "./util.js";

export async function newRunPage(app, _rest, params) {
  const configs = await api("/api/configs");
  const source = h("select", { id: "source" }, h("optgroup", { label: "examples" }, configs.examples.map(c => h("option", { value: c.source }, c.label))),
    configs.runs.length ? h("optgroup", { label: "existing runs" }, configs.runs.map(c => h("option", { value: c.source }, c.label))) : null);
  const command = h("select", { id: "command" }, ["train", "sft", "eval"].map(c => h("option", { value: c }, c)));
  const wanted = params.get("source") || configs.default;
  if (wanted && [...source.options].some(o => o.value === wanted)) source.value = wanted;
  const name = h("input", { id: "run-name", placeholder: "run name", value: defaultName(), style: { width: "220px" } });
  const text = h("textarea", { id: "yaml", spellcheck: false, wrap: "off", "aria-label": "config YAML" });
  const gutter = h("div", { class: "gutter", id: "gutter" });
  const overrides = h("textarea", { id: "overrides", rows: 4, placeholder: "one per line, e.g. trainer.steps=20", spellcheck: false });
  const evalModel = h("select", { id: "eval-model" });
  const evalLimit = h("input", { id: "eval-limit", type: "number", min: 1, value: 8, style: { width: "80px" } });
  const evalBox = h("div", { class: "row", style: { display: "none" } }, h("label", {}, "model to evaluate", evalModel), h("label", {}, "questions", evalLimit));
  const verdict = h("div", { id: "verdict" });
  // A reward section handed over by the Rewards page stays applied to whatever config is picked
  // here until the user drops it (or launches with it).
  let rewardSection = sessionStorage.getItem("studio.rewardSection");
  const rewardNote = h("div", { id: "reward-pending" });
  const launchBtn = h("button", { class: "primary", id: "launch" }, "Launch");
  const jobBox = h("div", { id: "job" });
  const jobsBox = h("div", { id: "jobs" });
  app.append(h("h1", {}, "New run"),
    h("div", { class: "cols" },
      h("div", {},
        h("div", { class: "panel" },
          h("div", { class: "row" }, h("label", {}, "start from", source), h("label", {}, "command", command), h("label", {}, "run name (folder in the runs dir)", name)),
          evalBox),
        rewardNote,
        h("div", { class: "editor" }, gutter, text)),
      h("div", {},
        h("div", { class: "panel" }, h("h3", { style: { marginTop: 0 } }, "Dotted overrides"), overrides,
          h("div", { class: "muted", style: { marginTop: "4px" } }, "Applied on top of the YAML, as on the command line (rlfactory train CONFIG key=value …).")),
        h("div", { class: "panel" }, h("h3", { style: { marginTop: 0 } }, "Validation"), verdict,
          h("div", { class: "row", style: { marginTop: "10px" } }, launchBtn, h("span", { class: "muted" }, "runs `rlfactory <command>` on the validated config"))),
        jobBox)),
    h("h2", {}, "Jobs"), jobsBox);
  for (const m of (await api("/api/models")).models) evalModel.append(h("option", { value: m.path }, m.label));

  const lines = () => overrides.value.split("\n").map(s => s.trim()).filter(Boolean);
  const paintGutter = (issues = []) => {
    const bad = new Map(issues.filter(i => i.line).map(i => [i.line, i.key]));
    const n = text.value.split("\n").length;
    gutter.replaceChildren(...Array.from({ length: n }, (_, i) => h("div", bad.has(i + 1) ? { class: "bad", title: bad.get(i + 1) } : {}, String(i + 1))));
    gutter.scrollTop = text.scrollTop;
  };
  text.addEventListener("scroll", () => { gutter.scrollTop = text.scrollTop; });
  let checks = 0;  // answers may come back out of order: only the latest check's answer is shown
  // Two steps: the config's own validation (instant), then the chosen command's checks before it
  // loads a model (env, tools, reward, data: seconds), run by the command's own code on the server.
  // "valid" is said only after both.
  const check = async () => {
    const mine = ++checks;
    const ask = async withCommand => {
      const r = await api("/api/config/check", { text: text.value, overrides: lines(), source: source.value,
        ...(withCommand ? { command: command.value } : {}) });
      verdict.dataset.answers = String(Number(verdict.dataset.answers || 0) + 1);  // answers received, late ones too
      return r;
    };
    const issuesBox = r => h("div", { class: "error-box", id: "config-errors" }, r.command ? `rlfactory ${r.command} would stop:` : "invalid config:",
      h("ul", { class: "issues" }, r.issues.map(i => h("li", { dataset: { key: i.key } }, h("code", {}, i.key), " ", i.message, i.line ? h("span", { class: "muted" }, ` (line ${i.line})`) : null))));
    try {
      let r = await ask(false);
      if (mine !== checks) return r.ok;
      paintGutter(r.issues);
      if (!r.ok) { verdict.replaceChildren(issuesBox(r)); return false; }
      verdict.replaceChildren(h("div", { class: "muted", id: "config-checking" }, h("span", { class: "spinner" }),
        ` The config validates; now checking its env, tools, reward and data as rlfactory ${command.value} does…`));
      r = await ask(true);
      if (mine !== checks) return r.ok;
      paintGutter(r.issues);
      verdict.replaceChildren(r.ok ? h("div", { class: "ok-box", id: "config-ok", dataset: { command: r.command } },
        `Config is valid for rlfactory ${r.command}: its env, tools, reward and data pass the command's own checks.`) : issuesBox(r));
      return r.ok;
    } catch (e) { if (mine === checks) verdict.replaceChildren(errorBox(e)); return false; }
  };
  const checkSoon = debounce(check, 400);
  text.addEventListener("input", () => { paintGutter(); checkSoon(); });
  overrides.addEventListener("input", checkSoon);
  const loadSource = async () => {
    const c = await api(`/api/config?source=${encodeURIComponent(source.value)}`);
    text.value = c.text;
    if (rewardSection) {
      text.value = (await api("/api/config/section", { text: text.value, section: "reward", value: JSON.parse(rewardSection) })).text;
    }
    showRewardNote(); paintGutter(); check();
  };
  const showRewardNote = () => {
    rewardNote.replaceChildren(rewardSection ? h("div", { class: "panel" }, "The reward section from the Rewards page is applied to the config below (and to any other you pick). ",
      h("button", { id: "drop-reward", onclick: () => { rewardSection = null; sessionStorage.removeItem("studio.rewardSection"); loadSource(); } }, "Drop it")) : "");
  };
  source.addEventListener("change", loadSource);
  command.addEventListener("change", () => { evalBox.style.display = command.value === "eval" ? "flex" : "none"; check(); });
  launchBtn.addEventListener("click", async () => {
    launchBtn.disabled = true;
    try {
      const r = await api("/api/jobs", { command: command.value, text: text.value, overrides: lines(), source: source.value, name: name.value,
        model: evalModel.value, limit: Number(evalLimit.value) || null });
      showJob(jobBox, r.job, refreshJobs);
      refreshJobs();
      name.value = defaultName();
      if (rewardSection) { rewardSection = null; sessionStorage.removeItem("studio.rewardSection"); showRewardNote(); }
    } catch (e) {
      if (e.issues && e.issues.length) paintGutter(e.issues);
      verdict.replaceChildren(errorBox(e));
    } finally { launchBtn.disabled = false; }
  });
  const refreshJobs = async () => {
    const { jobs } = await api("/api/jobs");
    jobsBox.replaceChildren(jobs.length ? h("div", { class: "panel" }, h("table", { id: "jobs-table" },
      h("thead", {}, h("tr", {}, ["job", "command", "run", "state", "started"].map(t => h("th", {}, t)))),
      h("tbody", {}, jobs.map(j => h("tr", { class: "clickable", onclick: () => showJob(jobBox, j, refreshJobs) },
        h("td", {}, j.id), h("td", {}, j.command), h("td", {}, j.run_id), h("td", {}, badge(j.state)), h("td", {}, ago(j.started)))))))
      : h("div", { class: "muted" }, "No jobs launched from the studio yet."));
  };
  await loadSource();
  await refreshJobs();
  if (params.get("job")) {
    const j = (await api(`/api/job?id=${encodeURIComponent(params.get("job"))}`)).job;
    showJob(jobBox, j, refreshJobs);
  }
}

function defaultName() {
  const d = new Date(), p = n => String(n).padStart(2, "0");
  return `run-${d.getFullYear()}${p(d.getMonth() + 1)}${p(d.getDate())}-${p(d.getHours())}${p(d.getMinutes())}${p(d.getSeconds())}`;
}

function showJob(box, job, onChange) {
  const state = h("span", { id: "job-state" }, badge(job.state));
  const log = h("pre", { class: "log", id: "job-log" });
  const stopBtn = h("button", { class: "danger", id: "stop" }, "Stop (Ctrl-C)");
  const stopInfo = h("div", { id: "stop-info", class: "muted" });
  const runLink = h("a", { href: `#/run/${encodeURIComponent(job.run_id)}`, id: "job-run" }, `open ${job.run_id}`);
  box.replaceChildren(h("div", { class: "panel", dataset: { job: job.id } },
    h("div", { class: "row" }, h("h3", { style: { margin: 0 } }, `job ${job.id}`), state, h("span", { class: "grow" }), runLink, stopBtn),
    h("div", { class: "mono muted", style: { margin: "6px 0" } }, "rlfactory " + job.argv.slice(1).join(" ")), log, stopInfo));
  const describeStop = j => {
    if (!j.stop || !j.stop.signal) return "";
    const esc = (j.stop.escalated || []).map(e => `${e.signal} to ${e.pids.length}`).join(", ");
    return `stopped with ${j.stop.signal}; ${j.stop.processes} process(es) before; ` +
      (j.stop.survivors && j.stop.survivors.length ? `${j.stop.survivors.length} left!` : "none left") + (esc ? ` (escalated: ${esc})` : " (no escalation needed)");
  };
  const update = j => {
    state.replaceChildren(badge(j.state));
    stopBtn.disabled = j.state !== "running";
    stopInfo.textContent = (j.state !== "running" && j.reason ? `${j.reason}. ` : "") + describeStop(j);
  };
  update(job);
  stopBtn.addEventListener("click", async () => {
    stopBtn.disabled = true; stopInfo.textContent = "sending SIGINT…";
    try { update((await api("/api/job/stop", { id: job.id })).job); onChange(); }
    catch (e) { stopInfo.textContent = e.message; }
  });
  let text = "";
  // The server ends the stream with `end` once the job has ended and its log is sent: close it,
  // or EventSource reconnects and the log is sent (and shown) again.
  const es = listen(`/api/job/events?id=${encodeURIComponent(job.id)}`, {
    end: () => es.close(),
    log: d => {
      // a progress bar rewrites its line with \r: keep the last version of each line
      text = (text + d.text).split("\n").map(l => { const parts = l.split("\r").filter(Boolean); return parts.length ? parts[parts.length - 1] : ""; }).join("\n").slice(-60000);
      log.textContent = text; log.scrollTop = log.scrollHeight;
    },
    state: j => { update(j); if (j.state !== "running") onChange(); },
  });
}
