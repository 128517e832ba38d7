// Small DOM and HTTP helpers shared by every page.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

export class ApiError extends Error {
  constructor(message, status, issues) { super(message); this.status = status; this.issues = issues || []; }
}

export async function api(path, body, method) {
  const opts = { method: method || (body === undefined ? "GET" : "POST"), credentials: "same-origin", headers: {} };
  if (body !== undefined) { opts.body = JSON.stringify(body); opts.headers["Content-Type"] = "application/json"; }
  const res = await fetch(path, opts);
  let data = null;
  try { data = await res.json(); } catch (e) { data = null; }
  if (!res.ok) throw new ApiError((data && data.error) || `${res.status} ${res.statusText}`, res.status, data && data.issues);
  return data;
}

export async function upload(file) {
  const res = await fetch(`/api/upload?name=${encodeURIComponent(file.name)}`, { method: "POST", body: file, credentials: "same-origin" });
  const data = await res.json().catch(() => ({}));
  if (!res.ok) throw new ApiError(data.error || `${res.status}`, res.status);
  return data;
}

export function qs(params) {
  const p = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== undefined && v !== null && v !== "") p.set(k, v);
  return p.toString();
}

export function fmt(x, digits = 3) {
  if (x === null || x === undefined || Number.isNaN(x)) return "–";
  if (typeof x !== "number") return String(x);
  if (x === 0) return "0";
  const a = Math.abs(x);
  if (a >= 1e5 || a < 1e-3) return x.toExponential(2);
  if (Number.isInteger(x)) return String(x);
  return x.toFixed(a >= 100 ? 1 : digits);
}

// "1 step", "3 steps"
export function count(n, noun) { return `${n} ${noun}${n === 1 ? "" : "s"}`; }

export function ago(t) {
  if (!t) return "–";
  const s = Date.now() / 1000 - t;
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(t * 1000).toLocaleString();
}

export function badge(status) { return h("span", { class: `badge ${status}` }, status); }

export function toast(msg) {
  const t = document.getElementById("toast");
  t.textContent = msg; t.style.display = "block";
  clearTimeout(toast._t); toast._t = setTimeout(() => { t.style.display = "none"; }, 4000);
}

export function errorBox(err) {
  const box = h("div", { class: "error-box", role: "alert" }, err.message || String(err));
  if (err.issues && err.issues.length) {
    box.append(h("ul", { class: "issues" }, err.issues.map(i => h("li", {}, h("code", {}, i.key), " ", i.message))));
  }
  return box;
}

// Server-sent events with named handlers; closed when the page changes.
const streams = new Set();
export function listen(url, handlers) {
  const es = new EventSource(url, { withCredentials: true });
  for (const [name, fn] of Object.entries(handlers)) es.addEventListener(name, ev => fn(JSON.parse(ev.data || "null")));
  streams.add(es);
  return es;
}
export function closeStreams() { for (const es of streams) es.close(); streams.clear(); }

// Key handlers that live only as long as the page that set them.
const keyHandlers = new Set();
export function onKeys(fn) { keyHandlers.add(fn); }
export function clearKeys() { keyHandlers.clear(); }
document.addEventListener("keydown", ev => {
  const t = ev.target;
  if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT") && ev.key !== "Escape") return;
  for (const fn of keyHandlers) fn(ev);
});

export function debounce(fn, ms) {
  let t = null;
  return (...args) => { clearTimeout(t); t = setTimeout(() => fn(...args), ms); };
}

export const PALETTE = ["#2f5fd0", "#e4572e", "#17a398", "#f2a541", "#7b2cbf", "#5c946e", "#d1495b", "#00798c", "#8d6a9f", "#c05746"];
