// A small canvas line chart: several series on one step (or time) axis, hover read-out, click to
// pick a step, click a legend entry to hide a series. Data can be appended (live runs).
// View settings (setView): smoothing (TensorBoard's debiased EMA; the raw line stays, faint), a
// log y axis, the x axis by step or by time since the run started. Drag across the plot to zoom
// into a range, Shift+drag to pan, double-click (or "reset zoom") to see everything again.
// PNG and CSV download what the chart shows.
import { h, fmt, PALETTE } from "./util.js";
import { ema, logTicks, timeTicks, duration, toCsv, slug } from "./chart_math.js";

const DRAG_PX = 5;  // a press that moves less than this is a click (pick a step)
const DOUBLE_MS = 300;  // a click picks its step only when no second click (double-click: reset zoom) follows

export class LineChart {
  constructor(title, { height = 170, onPick = null, logY = false } = {}) {
    this.series = [];
    this.onPick = onPick;
    this.view = { smooth: 0, logY, xMode: "step" };
    this.zoom = null;  // {x0, x1} in the x axis' units, or null: everything
    this.canvas = h("canvas", { height });
    this.tip = h("div", { class: "tip" });
    this.legend = h("div", { class: "legend" });
    this.note = h("span", { class: "muted", style: { fontWeight: 400, fontSize: "11px" } });
    this.unzoomBtn = h("button", { class: "chart-btn unzoom", title: "show the whole range (or double-click the chart)",
      onclick: () => this.resetZoom(), style: { display: "none" } }, "reset zoom");
    const tools = h("span", { class: "chart-tools" }, this.note, this.unzoomBtn,
      h("button", { class: "chart-btn png", title: "download this chart as PNG", onclick: () => this.downloadPng() }, "PNG"),
      h("button", { class: "chart-btn csv", title: "download this chart's data as CSV", onclick: () => this.downloadCsv() }, "CSV"));
    this.titleEl = h("span", {}, title);
    this.el = h("div", { class: "chart", dataset: { title, points: "0", zoomed: "0" } },
      h("div", { class: "title" }, this.titleEl, tools), this.canvas, this.legend, this.tip);
    this.height = height;
    this._mouse();
    new ResizeObserver(() => this.draw()).observe(this.el);
  }

  setTitle(title) { this.titleEl.textContent = title; this.el.dataset.title = title; }

  // series: [{name, steps, values, times?, color?, markers?, dashed?}]; times: seconds since the
  // run started, one per step (the time axis skips a series without them)
  setSeries(series) {
    this.series = series.map((s, i) => ({ color: PALETTE[i % PALETTE.length], hidden: false, ...s,
      steps: s.steps.slice(), values: s.values.slice(), times: s.times ? s.times.slice() : null }));
    this._legend();
    this.draw();
  }

  append(name, step, value, opts = {}, time = null) {
    let s = this.series.find(x => x.name === name);
    if (!s) {
      s = { name, steps: [], values: [], times: time === null ? null : [], color: PALETTE[this.series.length % PALETTE.length],
        hidden: false, ...opts };
      this.series.push(s); this._legend();
    }
    s.steps.push(step); s.values.push(value);
    if (s.times) s.times.push(time);
  }

  // {smooth: 0..0.999, logY: bool, xMode: "step" | "time"}; a new x axis forgets the zoom
  setView(view) {
    if (view.xMode !== undefined && view.xMode !== this.view.xMode) this.zoom = null;
    Object.assign(this.view, view);
    this.draw();
  }

  resetZoom() { this.zoom = null; this.draw(); }

  points() { return this.series.reduce((n, s) => n + s.values.filter(v => v !== null && v !== undefined).length, 0); }

  _legend() {
    this.legend.replaceChildren(...this.series.map(s => {
      const item = h("span", { class: s.hidden ? "off" : "", title: "click to hide or show", style: { cursor: "pointer" } },
        h("i", { style: { background: s.color } }), s.name);
      item.addEventListener("click", () => { s.hidden = !s.hidden; this._legend(); this.draw(); });
      return item;
    }));
  }

  // What is drawn: per visible series its x values and (smoothed) y values; with a log y axis,
  // values <= 0 cannot be drawn and are counted in `dropped`.
  _prepared() {
    const time = this.view.xMode === "time", log = this.view.logY;
    let dropped = 0;
    const out = [];
    for (const s of this.series) {
      if (s.hidden) continue;
      if (time && !s.times) continue;
      const xs = time ? s.times : s.steps;
      const ys = this.view.smooth > 0 ? ema(s.values, this.view.smooth) : s.values;
      if (log) for (const v of s.values) if (v !== null && v !== undefined && Number.isFinite(v) && v <= 0) dropped++;
      out.push({ s, xs, ys });
    }
    return { list: out, dropped };
  }

  _usable(v) { return v !== null && v !== undefined && Number.isFinite(v) && (!this.view.logY || v > 0); }

  _extent(list) {
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (const { s, xs, ys } of list) {
      for (let i = 0; i < xs.length; i++) {
        const x = xs[i];
        if (x === null || x === undefined) continue;
        x0 = Math.min(x0, x); x1 = Math.max(x1, x);
        if (this.zoom && (x < this.zoom.x0 || x > this.zoom.x1)) continue;
        for (const v of this.view.smooth > 0 ? [ys[i], s.values[i]] : [ys[i]]) {
          if (!this._usable(v)) continue;
          const y = this.view.logY ? Math.log10(v) : v;
          y0 = Math.min(y0, y); y1 = Math.max(y1, y);
        }
      }
    }
    if (!Number.isFinite(x0)) return null;
    if (this.zoom) { x0 = this.zoom.x0; x1 = this.zoom.x1; }
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (!Number.isFinite(y0)) { y0 = 0; y1 = 1; }
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
    this.el.dataset.zoomed = this.zoom ? "1" : "0";
    this.unzoomBtn.style.display = this.zoom ? "" : "none";
    const { list, dropped } = this._prepared();
    const ex = this._extent(list);
    this.ex = ex;
    this.el.dataset.x0 = ex ? String(ex.x0) : "";
    this.el.dataset.x1 = ex ? String(ex.x1) : "";
    this.el.dataset.dropped = String(dropped);
    this.el.dataset.y0 = ex ? String(ex.y0) : "";  // in log10 units on a log axis (data-scale="log")
    this.el.dataset.y1 = ex ? String(ex.y1) : "";
    this.el.dataset.scale = this.view.logY ? "log" : "linear";
    ctx.font = "11px system-ui, sans-serif";
    if (!ex) {
      ctx.fillStyle = "#9ca3af";
      const why = this.view.xMode === "time" && this.series.length ? "no times logged: pick the step axis" : "no data yet";
      ctx.fillText(why, g.l + 8, g.h / 2);
      return;
    }
    const X = s => g.l + (s - ex.x0) / (ex.x1 - ex.x0) * (g.w - g.l - g.r);
    const Yl = v => g.t + (1 - (v - ex.y0) / (ex.y1 - ex.y0)) * (g.h - g.t - g.b);
    const Y = this.view.logY ? v => Yl(Math.log10(v)) : Yl;
    ctx.strokeStyle = "#eceef2"; ctx.fillStyle = "#8b93a1"; ctx.lineWidth = 1;
    if (this.view.logY) {
      for (const v of logTicks(ex.y0, ex.y1)) {
        const y = Math.round(Y(v)) + 0.5;
        ctx.beginPath(); ctx.moveTo(g.l, y); ctx.lineTo(g.w - g.r, y); ctx.stroke();
        ctx.textAlign = "right"; ctx.fillText(v >= 1e-2 && v < 1e4 ? String(+v.toPrecision(3)) : v.toExponential(0), g.l - 5, y + 3);
      }
    } else {
      const yt = ticks(ex.y0, ex.y1, 4);
      const labels = tickLabels(yt);
      this.el.dataset.yticks = labels.join("|");  // what is drawn, for tests and readers
      for (const [i, v] of yt.entries()) {
        const y = Math.round(Y(v)) + 0.5;
        ctx.beginPath(); ctx.moveTo(g.l, y); ctx.lineTo(g.w - g.r, y); ctx.stroke();
        const label = labels[i];
        ctx.textAlign = "right"; ctx.fillText(label, g.l - 5, y + 3);
      }
    }
    ctx.textAlign = "center";
    if (this.view.xMode === "time") {
      for (const s of timeTicks(ex.x0, ex.x1, 5)) ctx.fillText(duration(s), X(s), g.h - 5);
    } else {
      for (const s of ticks(ex.x0, ex.x1, 6)) {
        if (!Number.isInteger(s)) continue;
        ctx.fillText(String(s), X(s), g.h - 5);
      }
    }
    ctx.save();
    ctx.beginPath(); ctx.rect(g.l, 0, g.w - g.l - g.r, g.h - g.b); ctx.clip();
    const smoothing = this.view.smooth > 0;
    for (const { s, xs, ys } of list) {
      ctx.strokeStyle = s.color; ctx.fillStyle = s.color;
      ctx.setLineDash(s.dashed ? [4, 3] : []);
      const shown = xs.filter(x => x !== null && (!this.zoom || (x >= ex.x0 && x <= ex.x1))).length;
      if (!s.markers) {
        if (smoothing) { ctx.globalAlpha = 0.25; ctx.lineWidth = 1.2; this._line(ctx, xs, s.values, X, Y); }
        ctx.globalAlpha = 1; ctx.lineWidth = 1.6; this._line(ctx, xs, ys, X, Y);
      }
      if (s.markers || shown < 40) {
        for (let i = 0; i < xs.length; i++) {
          const v = ys[i];
          if (xs[i] === null || !this._usable(v)) continue;
          ctx.beginPath(); ctx.arc(X(xs[i]), Y(v), s.markers ? 3.5 : 2, 0, 7); ctx.fill();
        }
      }
    }
    ctx.setLineDash([]);
    if (this.hoverX !== null && this.hoverX !== undefined) {
      ctx.strokeStyle = "#9ca3af"; ctx.beginPath(); const x = Math.round(X(this.hoverX)) + 0.5;
      ctx.moveTo(x, g.t); ctx.lineTo(x, g.h - g.b); ctx.stroke();
    }
    if (this.drag && this.drag.mode === "zoom") {
      ctx.fillStyle = "rgba(47,95,208,.12)";
      const a = Math.min(this.drag.from, this.drag.to), b = Math.max(this.drag.from, this.drag.to);
      ctx.fillRect(a, g.t, b - a, g.h - g.t - g.b);
    }
    ctx.restore();
  }

  _line(ctx, xs, ys, X, Y) {
    ctx.beginPath(); let pen = false;
    for (let i = 0; i < xs.length; i++) {
      const v = ys[i];
      if (xs[i] === null || !this._usable(v)) { pen = false; continue; }
      const x = X(xs[i]), y = Y(v);
      if (pen) ctx.lineTo(x, y); else { ctx.moveTo(x, y); pen = true; }
    }
    ctx.stroke();
  }

  _xAt(px) {
    const g = this._geom();
    return this.ex.x0 + (px - g.l) / (g.w - g.l - g.r) * (this.ex.x1 - this.ex.x0);
  }

  // The nearest logged point to canvas x `px`: {x, step} (step: the record's step, for picking).
  _nearest(px) {
    if (!this.ex) return null;
    const want = this._xAt(px);
    let best = null, bd = Infinity;
    for (const { s, xs } of this._prepared().list) {
      for (let i = 0; i < xs.length; i++) {
        if (xs[i] === null) continue;
        const d = Math.abs(xs[i] - want);
        if (d < bd) { bd = d; best = { x: xs[i], step: s.steps[i] }; }
      }
    }
    return best;
  }

  _mouse() {
    const c = this.canvas;
    const px = ev => ev.clientX - c.getBoundingClientRect().left;
    c.addEventListener("mousedown", ev => {
      if (ev.button !== 0 || !this.ex) return;
      ev.preventDefault();
      this.drag = { mode: ev.shiftKey ? "pan" : "zoom", from: px(ev), to: px(ev), ex: { ...this.ex } };
    });
    c.addEventListener("mousemove", ev => {
      if (this.drag) {
        this.drag.to = px(ev);
        if (this.drag.mode === "pan" && Math.abs(this.drag.to - this.drag.from) >= DRAG_PX) this._pan();
        this.draw();
        return;
      }
      this._hover(ev);
    });
    c.addEventListener("mouseup", ev => {
      const d = this.drag;
      this.drag = null;
      if (!d) return;
      if (Math.abs(d.to - d.from) < DRAG_PX) {  // a click: this step's trajectories
        const p = this._nearest(d.from);
        clearTimeout(this._pickTimer);
        if (p && this.onPick) this._pickTimer = setTimeout(() => this.onPick(p.step), DOUBLE_MS);
      } else if (d.mode === "zoom") {
        const a = this._xAt(Math.min(d.from, d.to)), b = this._xAt(Math.max(d.from, d.to));
        this.zoom = { x0: a, x1: b };
      }
      this.draw();
    });
    c.addEventListener("mouseleave", () => {
      this.tip.style.display = "none"; this.hoverX = null;
      if (this.drag) { this.drag = null; }
      this.draw();
    });
    c.addEventListener("dblclick", () => { clearTimeout(this._pickTimer); this.resetZoom(); });
  }

  _pan() {
    const d = this.drag, g = this._geom();
    const shift = (d.to - d.from) / (g.w - g.l - g.r) * (d.ex.x1 - d.ex.x0);
    this.zoom = { x0: d.ex.x0 - shift, x1: d.ex.x1 - shift };
  }

  _hover(ev) {
    const p = this._nearest(ev.clientX - this.canvas.getBoundingClientRect().left);
    if (p === null) return;
    this.hoverX = p.x; this.draw();
    const time = this.view.xMode === "time";
    const rows = this._prepared().list.map(({ s, xs, ys }) => {
      const i = xs.lastIndexOf(p.x);
      if (i < 0 || s.values[i] === null || s.values[i] === undefined) return null;
      return this.view.smooth > 0 ? `${s.name}: ${fmt(ys[i], 4)} (raw ${fmt(s.values[i], 4)})` : `${s.name}: ${fmt(s.values[i], 4)}`;
    }).filter(Boolean);
    this.tip.replaceChildren(h("b", {}, time ? `${duration(p.x)} · step ${p.step}` : `step ${p.step}`), ...rows.map(r => h("div", {}, r)),
      this.onPick ? h("div", { style: { opacity: .7 } }, "click: this step's trajectories · drag: zoom") : null);
    const r = this.el.getBoundingClientRect();
    const x = ev.clientX - r.left + 12;
    this.tip.style.display = "block";
    this.tip.style.left = `${Math.min(x, r.width - this.tip.offsetWidth - 4)}px`;
    this.tip.style.top = `${ev.clientY - r.top + 10}px`;
  }

  // The series as shown (visible ones; the time axis needs times), as CSV.
  csv() {
    const time = this.view.xMode === "time";
    return toCsv(this.series.filter(s => !s.hidden && (!time || s.times)), this.view.smooth);
  }

  // The chart with its title and legend, as a PNG blob.
  png() {
    const dpr = window.devicePixelRatio || 1, g = this._geom();
    const shown = this.series.filter(s => !s.hidden);
    const legendH = 16 * Math.max(1, Math.ceil(shown.length / 3));
    const out = document.createElement("canvas");
    out.width = Math.round(g.w * dpr); out.height = Math.round((g.h + 24 + legendH) * dpr);
    const ctx = out.getContext("2d");
    ctx.scale(dpr, dpr);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, g.w, g.h + 24 + legendH);
    ctx.fillStyle = "#1d2330"; ctx.font = "600 13px system-ui, sans-serif"; ctx.textAlign = "left";
    const extras = [this.view.smooth > 0 ? `smoothing ${this.view.smooth}` : "", this.view.logY ? "log scale" : "",
      this.view.xMode === "time" ? "x: time" : ""].filter(Boolean).join(", ");
    ctx.fillText(this.titleEl.textContent + (extras ? ` (${extras})` : ""), 6, 16);
    ctx.drawImage(this.canvas, 0, 24, g.w, g.h);
    ctx.font = "11px system-ui, sans-serif";
    const colW = g.w / 3;
    shown.forEach((s, i) => {
      const x = 8 + (i % 3) * colW, y = 24 + g.h + 12 + Math.floor(i / 3) * 16;
      ctx.fillStyle = s.color; ctx.fillRect(x, y - 5, 10, 3);
      ctx.fillStyle = "#4b5563"; ctx.fillText(s.name, x + 14, y);
    });
    return new Promise(resolve => out.toBlob(resolve, "image/png"));
  }

  async downloadPng() { save(await this.png(), `${slug(this.titleEl.textContent)}.png`); }

  downloadCsv() { save(new Blob([this.csv()], { type: "text/csv" }), `${slug(this.titleEl.textContent)}.csv`); }
}

function save(blob, name) {
  const url = URL.createObjectURL(blob);
  const a = h("a", { href: url, download: name, style: { display: "none" } });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
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
