// Pure helpers of the line chart: smoothing, log and time axes, CSV. No DOM here.

// TensorBoard's smoothing: an exponential moving average, debiased so the first points are not
// pulled towards 0 (divided by 1 - w^n after n points). Missing values stay missing; a constant
// series stays itself. weight in [0, 1): 0 is no smoothing.
export function ema(values, weight) {
  if (!(weight > 0)) return values.slice();
  const finite = values.filter(v => v !== null && v !== undefined && Number.isFinite(v));
  const constant = finite.every(v => v === finite[0]);
  let last = 0, n = 0;
  return values.map(v => {
    if (v === null || v === undefined || !Number.isFinite(v)) return v;
    if (constant) return v;
    last = last * weight + (1 - weight) * v;
    n += 1;
    return last / (1 - Math.pow(weight, n));
  });
}

// Seconds since the run's first record, one per record: from `wall_time` (unix seconds, logged
// with each record) or, for runs logged before it was, the running sum of `time/step_s`.
// null when the run has neither.
export function relativeTimes(wall, stepSeconds) {
  const ok = v => v !== null && v !== undefined && Number.isFinite(v);
  if (wall && wall.some(ok)) {
    const t0 = wall.find(ok);
    return wall.map(v => ok(v) ? v - t0 : null);
  }
  if (stepSeconds && stepSeconds.some(ok)) {
    let t = 0;
    return stepSeconds.map(v => { t += ok(v) ? v : 0; return t; });
  }
  return null;
}

// Ticks of a log axis whose ends are lo10 and hi10 (log10 of the values): the powers of ten
// inside, with 2 and 5 times them when fewer than three decades show. Values, not logs.
export function logTicks(lo10, hi10) {
  const out = [];
  const few = hi10 - lo10 < 3;
  for (let k = Math.floor(lo10); k <= Math.ceil(hi10); k++) {
    for (const m of few ? [1, 2, 5] : [1]) {
      const v = m * Math.pow(10, k), l = Math.log10(v);
      if (l >= lo10 - 1e-9 && l <= hi10 + 1e-9) out.push(v);
    }
  }
  return out.length ? out : [Math.pow(10, (lo10 + hi10) / 2)];
}

const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

// Ticks of a time axis in seconds: about n, on round durations.
export function timeTicks(lo, hi, n) {
  const span = hi - lo;
  if (!(span > 0)) return [lo];
  const step = TIME_STEPS.find(s => s >= span / n) || Math.ceil(span / n / 86400) * 86400;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) out.push(v);
  return out;
}

// A duration as the axis writes it: 45s, 2m30s, 1h05m, 2d03h.
export function duration(s) {
  const neg = s < 0 ? "-" : "";
  s = Math.round(Math.abs(s));
  const pad = x => String(x).padStart(2, "0");
  if (s < 60) return `${neg}${s}s`;
  if (s < 3600) return `${neg}${Math.floor(s / 60)}m${s % 60 ? pad(s % 60) + "s" : ""}`;
  if (s < 86400) return `${neg}${Math.floor(s / 3600)}h${pad(Math.floor(s / 60) % 60)}m`;
  return `${neg}${Math.floor(s / 86400)}d${pad(Math.floor(s / 3600) % 24)}h`;
}

// The series as CSV: one row per step (the union of every series' steps), one column per series;
// `time_s` (seconds since the start) when the series have times, and each series' smoothed
// values beside it when a smoothing weight is given.
export function toCsv(series, weight = 0) {
  const quote = s => /[",\n\r]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  const hasTime = series.some(s => s.times);
  const rows = new Map();
  const cols = [];
  series.forEach((s, k) => {
    const smooth = weight > 0 ? ema(s.values, weight) : null;
    cols.push(quote(s.name));
    if (smooth) cols.push(quote(`${s.name} (smoothed)`));
    s.steps.forEach((step, i) => {
      let row = rows.get(step);
      if (!row) { row = { time: null, cells: new Map() }; rows.set(step, row); }
      if (hasTime && row.time === null && s.times && s.times[i] !== null && s.times[i] !== undefined) row.time = s.times[i];
      row.cells.set(k, [s.values[i], smooth ? smooth[i] : undefined]);
    });
  });
  const cell = v => (v === null || v === undefined || !Number.isFinite(v)) ? "" : String(v);
  const lines = [["step", ...(hasTime ? ["time_s"] : []), ...cols].join(",")];
  for (const step of [...rows.keys()].sort((a, b) => a - b)) {
    const row = rows.get(step);
    const out = [String(step)];
    if (hasTime) out.push(cell(row.time));
    series.forEach((s, k) => {
      const [v, sm] = row.cells.get(k) || [null, null];
      out.push(cell(v));
      if (weight > 0) out.push(cell(sm));
    });
    lines.push(out.join(","));
  }
  return lines.join("\n") + "\n";
}

// A file name made of a chart's title.
export function slug(title) {
  return (title || "chart").toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "") || "chart";
}
