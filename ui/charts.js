// -- charts: the last 10 minutes of every child, from the supervisor's /api/v1/series.

import { $, state } from "./state.js";
import { api } from "./api.js";
import { modelOf, renderServers } from "./status.js";
import { updateDemoBanner } from "./try-it.js";

export const COLOURS = ["#2f7ed8", "#e4572e", "#17a398", "#9c59d1", "#f0a202", "#6c757d"];

export async function refreshSeries() {
  const series = await api("/api/v1/series", { poll: true });
  state.series = series;
  for (const [id, s] of Object.entries(series.servers)) {
    if (s.version) state.versions[modelOf(id)] = s.version;
    if (s.optimize && s.optimize !== "loading") state.modes[modelOf(id)] = s.optimize; // what auto chose, or the mode named
  }
  drawGatewayCharts(series);
  for (const [id, s] of Object.entries(series.servers)) drawModelCharts(id, s, series);
  if (state.status) renderServers(state.status.servers);
  updateDemoBanner();
}

export function drawModelCharts(id, s, all) {
  const holder = document.querySelector(`tr.figures[data-for="${id}"] .charts`);
  if (!holder) return;
  const m = state.catalog.find((c) => c.id === modelOf(id));
  const span = { t: s.t, now: all.now, window: all.window_s };
  chart(holder, "rps", "requests/s", span, [{ name: "req/s", values: s.rps }], (v) => v.toFixed(2));
  chart(holder, "latency", "latency", span, [{ name: "p50", values: s.p50_ms }, { name: "p99", values: s.p99_ms }], ms);
  chart(holder, "batch", "batch size (mean)", span, [{ name: "items", values: s.batch_mean }], (v) => v.toFixed(1));
  chart(holder, "queue", "queue depth", span, [{ name: "items", values: s.queue_depth }], (v) => v.toFixed(0));
  if (m && m.async) {
    chart(holder, "jobs", "jobs", span,
          [{ name: "pending", values: s.jobs_pending }, { name: "running", values: s.jobs_running }], (v) => v.toFixed(0));
  }
}

export function drawGatewayCharts(all) {
  const g = all.gateway;
  const holder = $("#gateway-charts");
  const span = { t: g.t, now: all.now, window: all.window_s };
  const labelled = (map) => Object.entries(map).map(([name, values]) => ({ name, values }));
  // A line per route (per reason): the title gives their total, the legend their names.
  chart(holder, "rps_by_route", "requests/s by route", span, labelled(g.rps_by_route), (v) => v.toFixed(2), true);
  chart(holder, "rejections", "rejections/s by reason", span, labelled(g.rejections_by_reason), (v) => v.toFixed(2), true);
  chart(holder, "upstream_errors", "upstream errors/s", span, [{ name: "errors", values: g.upstream_errors }], (v) => v.toFixed(2));
}

export function ms(v) {
  return v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${v.toFixed(v < 10 ? 1 : 0)} ms`;
}

// One small chart: an inline SVG with a line per series over the window, breaks where a sample is null
// (a failed scrape, no request to measure), and the newest sample of each line in the title ("–" when it
// is empty: an older value next to the other lines' newest would read as now), or with `total` their sum.
export function chart(holder, key, title, span, lines, format, total = false) {
  const W = 190, H = 46, PAD = 3;
  let box = holder.querySelector(`.chart[data-figure="${key}"]`);
  if (!box) {
    box = document.createElement("div");
    box.className = "chart";
    box.dataset.figure = key;
    box.innerHTML = `<div class="title"><span class="name"></span><span class="value"></span></div>
      <svg viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" role="img"></svg><div class="legend"></div>`;
    holder.appendChild(box);
    // The chart's name for a screen reader: whose (a model, a replica "ID.n", else the gateway) and what.
    const owner = holder.closest("tr.figures");
    const who = owner ? owner.dataset.for.replace(/\.(\d+)$/, " replica $1") : "gateway";
    box.querySelector("svg").setAttribute("aria-label", `${who}: ${title}`);
  }
  box.querySelector(".name").textContent = title;
  let max = 0;
  for (const line of lines) for (const v of line.values) if (v !== null && v > max) max = v;
  const top = max > 0 ? max * 1.1 : 1;
  const x = (t) => PAD + (W - 2 * PAD) * (1 - (span.now - t) / span.window);
  const y = (v) => H - PAD - (H - 2 * PAD) * (v / top);
  const svg = box.querySelector("svg");
  svg.replaceChildren();
  const NS = "http://www.w3.org/2000/svg";
  const latest = [];
  lines.forEach((line, i) => {
    const colour = COLOURS[i % COLOURS.length];
    let d = "";
    let pen = false;
    line.values.forEach((v, j) => {
      if (v === null || v === undefined) { pen = false; return; }
      d += `${pen ? "L" : "M"}${x(span.t[j]).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
    });
    const newest = line.values[line.values.length - 1];
    const last = newest === undefined ? null : newest;
    line.values.forEach((v, j) => { // a point between two gaps is a dot (a line needs two)
      const gap = (k) => k < 0 || k >= line.values.length || line.values[k] === null || line.values[k] === undefined;
      if (gap(j) || !gap(j - 1) || !gap(j + 1)) return;
      const dot = document.createElementNS(NS, "circle");
      dot.setAttribute("cx", x(span.t[j]).toFixed(1));
      dot.setAttribute("cy", y(v).toFixed(1));
      dot.setAttribute("r", "1.8");
      dot.setAttribute("fill", colour);
      svg.appendChild(dot);
    });
    if (d) {
      const path = document.createElementNS(NS, "path");
      path.setAttribute("d", d);
      path.setAttribute("fill", "none");
      path.setAttribute("stroke", colour);
      path.setAttribute("stroke-width", "1.5");
      path.setAttribute("vector-effect", "non-scaling-stroke");
      svg.appendChild(path);
    }
    latest.push({ name: line.name, colour, last });
  });
  const known = latest.filter((l) => l.last !== null);
  const now = total ? (known.length ? `total ${format(known.reduce((sum, l) => sum + l.last, 0))}` : "–")
    : latest.map((l) => (l.last === null ? "–" : format(l.last))).join(" / ");
  box.querySelector(".value").textContent = lines.length ? now : "–";
  box.querySelector(".legend").innerHTML = "";
  for (const l of latest) {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = l.colour;
    item.append(swatch, l.name);
    box.querySelector(".legend").appendChild(item);
  }
  box.dataset.max = String(max);
  box.dataset.points = String(lines.reduce((n, l) => n + l.values.filter((v) => v !== null && v !== undefined).length, 0));
}
