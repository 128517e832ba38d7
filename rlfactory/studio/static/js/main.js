// Router: #/runs, #/run/<id>[?tab=...&step=...], #/new, #/tools, #/rewards, #/data, #/playground.
import { api, h, closeStreams, clearKeys, errorBox } from "./util.js";
import { runsPage } from "./runs.js";
import { runPage } from "./run.js";
import { newRunPage } from "./newrun.js";
import { toolsPage } from "./tools.js";
import { rewardsPage } from "./rewards.js";
import { dataPage } from "./data.js";
import { playgroundPage } from "./playground.js";

const pages = { runs: runsPage, run: runPage, new: newRunPage, tools: toolsPage, rewards: rewardsPage, data: dataPage,
  playground: playgroundPage };

export function parseHash() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query] = raw.split("?");
  const parts = path.split("/");
  const name = parts[0] || "runs";
  return { name, rest: decodeURIComponent(parts.slice(1).join("/")), params: new URLSearchParams(query || "") };
}

async function route() {
  closeStreams();
  clearKeys();
  const { name, rest, params } = parseHash();
  const page = pages[name] || runsPage;
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === (name === "run" ? "runs" : name));
  const app = document.getElementById("app");
  app.replaceChildren();
  app.dataset.page = name;
  try {
    await page(app, rest, params);
  } catch (err) {
    app.append(errorBox(err));
  }
}

window.addEventListener("hashchange", route);
api("/api/whoami").then(w => { document.getElementById("where").textContent = `runs: ${w.runs}`; }).catch(() => {});
route();
