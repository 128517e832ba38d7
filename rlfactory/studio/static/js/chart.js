// A small canvas line chart: several series on one step axis, hover read-out, click to pick a
// step, click a legend entry to hide a series. Data can be appended (live runs).
import { h, fmt, PALETTE } from "./util.js";

export class LineChart {
  constructor(title, { height = 170, onPick = null, logY = false } = {}) {
    this.series = [];
    this.onPick = onPick;
    this.logY = logY;
    this.canvas = h("canvas", { height });
    this.tip = h("div", { class: "tip" });
    this.legend = h("div", { class: "legend" });
    this.note = h("span", { class: "muted", style: { fontWeight: 400, fontSize: "11px" } });
    this.el = h("div", { class: "chart", dataset: { title, points: "0" } },
      h("div", { class: "title" }, h("span", {}, title), this.note), this.canvas, this.legend, this.tip);
    this.height = height;
    this.canvas.addEventListener("mousemove", ev => this._hover(ev));
    this.canvas.addEventListener("mouseleave", () => { this.tip.style.display = "none"; this.hoverStep = null; this.draw(); });
    this.canvas.addEventListener("click", ev => { const s = this._stepAt(ev); if (s !== null && this.onPick) this.onPick(s); });
    new ResizeObserver(() => this.draw()).observe(this.el);
  }

  // series: [{name, steps, values, color?, markers?, dashed?}]
  setSeries(series) {
    this.series = series.map((s, i) => ({ color: PALETTE[i % PALETTE.length], hidden: false, ...s,
      steps: s.steps.slice(), values: s.values.slice() }));
    this._legend();
    this.draw();
  }

  append(name, step, value, opts = {}) {
    let s = this.series.find(x => x.name === name);
    if (!s) {
      s = { name, steps: [], values: [], color: PALETTE[this.series.length % PALETTE.length], hidden: false, ...opts };
      this.series.push(s); this._legend();
    }
    s.steps.push(step); s.values.push(value);
  }

  points() { return this.series.reduce((n, s) => n + s.values.filter(v => v !== null && v !== undefined).length, 0); }

  _legend() {
    this.legend.replaceChildren(...this.series.map(s => {
      const item = h("span", { class: s.hidden ? "off" : "", title: "click to hide or show", style: { cursor: "pointer" } },
        h("i", { style: { background: s.color } }), s.name);
      item.addEventListener("click", () => { s.hidden = !s.hidden; this._legend(); this.draw(); });
      return item;
    }));
  }

  _extent() {
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const s of this.series) {
      if (s.hidden) continue;
      for (let i = 0; i < s.steps.length; i++) {
        const v = s.values[i];
        if (v === null || v === undefined || !Number.isFinite(v)) continue;
        x0 = Math.min(x0, s.steps[i]); x1 = Math.max(x1, s.steps[i]);
        y0 = Math.min(y0, v); y1 = Math.max(y1, v);
      }
    }
    if (!Number.isFinite(x0)) return null;
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const pad = (y1 - y0) * 0.06;
    return { x0, x1, y0: y0 - pad, y1: y1 + pad };
  }

  _geom() {
    const w = this.canvas.clientWidth || 400, hgt = this.height;
    return { w, h: hgt, l: 48, r: 10, t: 8, b: 20 };
  }

  draw() {
    const c = this.canvas, dpr = window.devicePixelRatio || 1, g = this._geom();
    if (c.width !== Math.round(g.w * dpr)) { c.width = Math.round(g.w * dpr); c.height = Math.round(g.h * dpr); }
    const ctx = c.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, g.w, g.h);
    this.el.dataset.points = String(this.points());
    const ex = this._extent();
    this.ex = ex;
    ctx.font = "11px system-ui, sans-serif";
    if (!ex) { ctx.fillStyle = "#9ca3af"; ctx.fillText("no data yet", g.l + 8, g.h / 2); return; }
    const X = s => g.l + (s - ex.x0) / (ex.x1 - ex.x0) * (g.w - g.l - g.r);
    const Y = v => g.t + (1 - (v - ex.y0) / (ex.y1 - ex.y0)) * (g.h - g.t - g.b);
    ctx.strokeStyle = "#eceef2"; ctx.fillStyle = "#8b93a1"; ctx.lineWidth = 1;
    const yt = ticks(ex.y0, ex.y1, 4);
    const labels = tickLabels(yt);
    this.el.dataset.yticks = labels.join("|");  // what is drawn, for tests and readers
    for (const [i, v] of yt.entries()) {
      const y = Math.round(Y(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(g.l, y); ctx.lineTo(g.w - g.r, y); ctx.stroke();
      const label = labels[i];
      ctx.textAlign = "right"; ctx.fillText(label, g.l - 5, y + 3);
    }
    ctx.textAlign = "center";
    for (const s of ticks(ex.x0, ex.x1, 6)) {
      if (!Number.isInteger(s)) continue;
      ctx.fillText(String(s), X(s), g.h - 5);
    }
    for (const s of this.series) {
      if (s.hidden) continue;
      ctx.strokeStyle = s.color; ctx.fillStyle = s.color; ctx.lineWidth = 1.6;
      ctx.setLineDash(s.dashed ? [4, 3] : []);
      if (!s.markers) {
        ctx.beginPath(); let pen = false;
        for (let i = 0; i < s.steps.length; i++) {
          const v = s.values[i];
          if (v === null || v === undefined || !Number.isFinite(v)) { pen = false; continue; }
          const x = X(s.steps[i]), y = Y(v);
          if (pen) ctx.lineTo(x, y); else { ctx.moveTo(x, y); pen = true; }
        }
        ctx.stroke();
      }
      if (s.markers || s.steps.length < 40) {
        for (let i = 0; i < s.steps.length; i++) {
          const v = s.values[i];
          if (v === null || v === undefined || !Number.isFinite(v)) continue;
          ctx.beginPath(); ctx.arc(X(s.steps[i]), Y(v), s.markers ? 3.5 : 2, 0, 7); ctx.fill();
        }
      }
    }
    ctx.setLineDash([]);
    if (this.hoverStep !== null && this.hoverStep !== undefined) {
      ctx.strokeStyle = "#9ca3af"; ctx.beginPath(); const x = Math.round(X(this.hoverStep)) + 0.5;
      ctx.moveTo(x, g.t); ctx.lineTo(x, g.h - g.b); ctx.stroke();
    }
  }

  _stepAt(ev) {
    if (!this.ex) return null;
    const g = this._geom(), r = this.canvas.getBoundingClientRect();
    const x = ev.clientX - r.left;
    const s = this.ex.x0 + (x - g.l) / (g.w - g.l - g.r) * (this.ex.x1 - this.ex.x0);
    let best = null, bd = Infinity;
    for (const se of this.series) {
      if (se.hidden) continue;
      for (const st of se.steps) { const d = Math.abs(st - s); if (d < bd) { bd = d; best = st; } }
    }
    return best;
  }

  _hover(ev) {
    const step = this._stepAt(ev);
    if (step === null) return;
    this.hoverStep = step; this.draw();
    const rows = this.series.filter(s => !s.hidden).map(s => {
      const i = s.steps.lastIndexOf(step);
      return i >= 0 && s.values[i] !== null ? `${s.name}: ${fmt(s.values[i], 4)}` : null;
    }).filter(Boolean);
    this.tip.replaceChildren(h("b", {}, `step ${step}`), ...rows.map(r => h("div", {}, r)),
      this.onPick ? h("div", { style: { opacity: .7 } }, "click: this step's trajectories") : null);
    const r = this.el.getBoundingClientRect();
    const x = ev.clientX - r.left + 12;
    this.tip.style.display = "block";
    this.tip.style.left = `${Math.min(x, r.width - this.tip.offsetWidth - 4)}px`;
    this.tip.style.top = `${ev.clientY - r.top + 10}px`;
  }
}

// Labels for tick values: the fewest significant digits that tell every tick apart (a narrow
// range such as 7.6012 .. 7.6018 needs five), in exponent form only for huge or tiny numbers.
export function tickLabels(values) {
  const big = values.some(v => Math.abs(v) >= 1e5), tiny = values.every(v => v === 0 || Math.abs(v) < 1e-3);
  for (let p = 1; p <= 12; p++) {
    const labels = values.map(v => v === 0 ? "0" : (big || tiny) ? v.toExponential(p - 1) : String(+v.toPrecision(p)));
    if (new Set(labels).size === labels.length) return labels;
  }
  return values.map(String);
}

function ticks(lo, hi, n) {
  const span = hi - lo;
  if (!(span > 0)) return [lo];
  const step0 = span / n, mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= step0) || step0;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-12; v += step) out.push(Math.round(v / step) * step);
  return out;
}
