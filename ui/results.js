// -- results: a reply drawn by its model's category (classes, boxes, a generated image, masks).

import { state } from "./state.js";

export const DETECTION_MAX_RESULTS = 20; // options.max_results the page sends to detection and segmentation models

// A canvas the size of the photo with the photo drawn on it, to draw a result over: class
// `KIND overlay`, data-count the number of results drawn (the browser tests read it).
function overlay(img, kind, count) {
  const canvas = document.createElement("canvas");
  canvas.width = img.naturalWidth;
  canvas.height = img.naturalHeight;
  canvas.className = `${kind} overlay`;
  canvas.dataset.count = String(count);
  const ctx = canvas.getContext("2d");
  ctx.drawImage(img, 0, 0);
  return [canvas, ctx];
}

export function showClasses(out, data) {
  if (!data || !(data.categories || data.category)) return; // nothing to draw: the raw JSON shows it
  const list = document.createElement("ol");
  list.className = "classes";
  const names = data.categories || [data.category];
  const scores = data.scores || [];
  names.forEach((name, i) => {
    const li = document.createElement("li");
    const label = document.createElement("span");
    label.textContent = name;
    if (i === 0) label.className = "top-class";
    const score = document.createElement("span");
    score.textContent = scores[i] !== undefined ? `${(scores[i] * 100).toFixed(2)} %` : "";
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.width = `${Math.max(1, (scores[i] || 0) / (scores[0] || 1) * 100)}%`;
    li.append(label, score, bar);
    list.appendChild(li);
  });
  out.appendChild(list);
}

export function withImage(callback) {
  const img = new Image();
  img.onload = () => callback(img);
  img.src = state.image;
}

export function colour(i) {
  return `hsl(${(i * 67) % 360} 85% 45%)`;
}

export function caption(text, className) {
  const p = document.createElement("p");
  p.className = className || "muted caption";
  p.textContent = text;
  return p;
}

// Boxes above the score threshold in force, at most DETECTION_MAX_RESULTS, each labelled, with a table beside.
export function showBoxes(out, detections, params) {
  if (!state.image) return;
  const threshold = typeof params.score_threshold === "number" ? params.score_threshold : 0;
  const kept = (detections || []).filter((d) => d.score > threshold)
    .slice(0, DETECTION_MAX_RESULTS);
  const holder = document.createElement("div");
  holder.className = "result-row";
  out.appendChild(holder);
  out.appendChild(caption(`${kept.length} detection${kept.length === 1 ? "" : "s"} above score ${threshold}` +
    ` (at most ${DETECTION_MAX_RESULTS} shown)`));
  withImage((img) => {
    const [canvas, ctx] = overlay(img, "detections", kept.length);
    const line = Math.max(2, img.naturalWidth / 300);
    const size = Math.max(12, Math.round(img.naturalWidth / 45));
    ctx.lineWidth = line;
    ctx.font = `${size}px sans-serif`;
    ctx.textBaseline = "top";
    kept.forEach((d, i) => {
      const [x1, y1, x2, y2] = d.bbox;
      ctx.strokeStyle = colour(i);
      ctx.strokeRect(x1, y1, x2 - x1, y2 - y1);
      const label = `${i + 1} ${d.category} ${d.score.toFixed(2)}`;
      const w = ctx.measureText(label).width + 6;
      const ty = y1 - size - 4 >= 0 ? y1 - size - 4 : y1;
      ctx.fillStyle = colour(i);
      ctx.fillRect(x1, ty, w, size + 4);
      ctx.fillStyle = "#fff";
      ctx.fillText(label, x1 + 3, ty + 2);
    });
    holder.appendChild(canvas);
    const table = document.createElement("table");
    table.className = "detections-table";
    table.innerHTML = "<thead><tr><th></th><th>#</th><th>class</th><th>score</th><th>box (x1, y1, x2, y2)</th></tr></thead><tbody></tbody>";
    kept.forEach((d, i) => {
      const tr = document.createElement("tr");
      const swatch = document.createElement("i");
      swatch.style.background = colour(i);
      const cells = [swatch, String(i + 1), d.category, d.score.toFixed(3), d.bbox.map((v) => Math.round(v)).join(", ")];
      for (const c of cells) {
        const td = document.createElement("td");
        if (typeof c === "string") td.textContent = c; else td.appendChild(c);
        tr.appendChild(td);
      }
      table.tBodies[0].appendChild(tr);
    });
    holder.appendChild(table);
  });
}

// Generated images are small (16 to 64 pixels): scaled up by a whole factor, pixels kept sharp. The seed is
// named when the data has one (a diffusion sample's; an image-to-image model's result has none).
export function showImage(out, data) {
  const img = document.createElement("img");
  const format = (data.format || "png").toLowerCase();
  const factor = Math.max(1, Math.floor(256 / Math.max(data.width || 256, data.height || 256)));
  const seed = data.seed === undefined ? "" : `, seed ${data.seed}`;
  img.src = `data:image/${format === "jpg" ? "jpeg" : format};base64,${data.image}`;
  img.alt = `generated ${data.width}x${data.height}${seed}`;
  img.className = "generated";
  img.width = data.width * factor;
  img.height = data.height * factor;
  out.appendChild(img);
  out.appendChild(caption(`${data.width}×${data.height} px, shown ×${factor}${seed.replace(",", ";")}`));
}

// Each mask: a translucent fill in its own colour and an opaque outline; or a plain message when none.
export function showMasks(out, masks) {
  if (!state.image) return;
  const pngs = (masks || []).filter((m) => typeof m.segmentation === "string"); // RLE: the raw JSON shows it
  if (!pngs.length) {
    out.appendChild(caption(`${(masks || []).length} masks at these thresholds`, "masks-none"));
    return;
  }
  out.appendChild(caption(`${pngs.length} mask${pngs.length === 1 ? "" : "s"}`, "muted caption masks-count"));
  withImage((img) => {
    const [canvas, ctx] = overlay(img, "masks", pngs.length);
    out.insertBefore(canvas, out.querySelector(".masks-count"));
    pngs.forEach((m, i) => {
      const mask = new Image();
      mask.onload = () => {
        const layer = document.createElement("canvas");
        const w = (layer.width = canvas.width);
        const h = (layer.height = canvas.height);
        const lctx = layer.getContext("2d");
        lctx.drawImage(mask, 0, 0, w, h);
        const pixels = lctx.getImageData(0, 0, w, h);
        const on = new Uint8Array(w * h);
        for (let p = 0; p < on.length; p += 1) on[p] = pixels.data[p * 4] > 127 ? 1 : 0;
        const [r, g, b] = hslToRgb(((i * 67) % 360) / 360, 0.85, 0.5);
        for (let p = 0; p < on.length; p += 1) {
          const x = p % w, y = (p - x) / w;
          const edge = on[p] && (x === 0 || y === 0 || x === w - 1 || y === h - 1 ||
                                 !on[p - 1] || !on[p + 1] || !on[p - w] || !on[p + w]);
          const q = p * 4;
          pixels.data[q] = r; pixels.data[q + 1] = g; pixels.data[q + 2] = b;
          pixels.data[q + 3] = edge ? 255 : on[p] ? 100 : 0;
        }
        lctx.putImageData(pixels, 0, 0);
        ctx.drawImage(layer, 0, 0);
        canvas.dataset.drawn = String(Number(canvas.dataset.drawn || 0) + 1);
      };
      mask.src = `data:image/png;base64,${m.segmentation}`;
    });
  });
}

export function hslToRgb(h, s, l) {
  const f = (n) => { const k = (n + h * 12) % 12; const a = s * Math.min(l, 1 - l); return Math.round(255 * (l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1)))); };
  return [f(0), f(8), f(4)];
}
