// The KV-cache calculator (docs/kv-calculator.md): bytes of a published model's cache at a context, batch and element
// type, from the terms attention/report/kv_calculator.py writes into the page (read off layer_cache_bytes, the
// package's one definition). Exact integers (BigInt): the browser test compares them with kv_cache_bytes.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("kv-calculator-data").textContent);
  const form = document.getElementById("kv-calculator");
  const model = form.querySelector("#kv-model");
  const context = form.querySelector("#kv-context");
  const batch = form.querySelector("#kv-batch");
  const dtype = form.querySelector("#kv-dtype");
  const result = document.getElementById("kv-result");
  const lines = document.getElementById("kv-lines");
  const chart = document.getElementById("kv-chart");
  const MAX_CONTEXT = 16777216;
  const MAX_BATCH = 4096;

  data.models.forEach(function (entry, index) {
    model.add(new Option(entry.name, String(index)));
  });
  Object.keys(data.dtypes).forEach(function (name) {
    dtype.add(new Option(name, name, name === "bfloat16", name === "bfloat16"));
  });

  // One sequence's cache in bytes: per group, count * (per_position * e * min(n, window)
  // + per_entry * e * floor(n / rate) + state * max(e, 4) + fixed * e)
  function sequenceBytes(groups, positions, itemsize) {
    const e = BigInt(itemsize), n = BigInt(positions), stateSize = BigInt(Math.max(itemsize, 4));
    let total = 0n;
    groups.forEach(function (g) {
      const kept = g.window === null ? n : (n < BigInt(g.window) ? n : BigInt(g.window));
      const entries = g.rate === null ? 0n : n / BigInt(g.rate);  // BigInt division floors
      total += BigInt(g.count) * (BigInt(g.per_position) * e * kept + BigInt(g.per_entry) * e * entries
                                  + BigInt(g.state) * stateSize + BigInt(g.fixed) * e);
    });
    return total;
  }

  function readCount(input, name, largest) {
    const text = input.value.trim();
    if (!/^[0-9]+$/.test(text)) return [null, name + " must be a whole number, got \u201c" + text + "\u201d"];
    const value = Number(text);
    if (value < 1 || value > largest) {
      return [null, name + " must be from 1 to " + largest.toLocaleString("en-US") + ", got " + text];
    }
    return [value, null];
  }

  function gib(bytes) {
    return (Number(bytes) / 2 ** 30).toFixed(2);
  }

  function svg(tag, attributes, text) {
    const element = document.createElementNS("http://www.w3.org/2000/svg", tag);
    Object.keys(attributes).forEach(function (key) { element.setAttribute(key, attributes[key]); });
    if (text !== undefined) element.textContent = text;
    return element;
  }

  // GiB against context (log2 on x, from 1k to 4x past the larger of 1M and the chosen context), the choice marked.
  function draw(entry, positions, sequences, itemsize) {
    while (chart.firstChild) chart.removeChild(chart.firstChild);
    const width = 640, height = 260, left = 64, right = 16, top = 16, bottom = 40;
    const first = 10, last = Math.max(20, Math.ceil(Math.log2(positions)) + 2);
    const points = [];
    for (let k = first; k <= last; k += 0.25) {
      const n = Math.round(2 ** k);
      points.push([k, Number(BigInt(sequences) * sequenceBytes(entry.groups, n, itemsize)) / 2 ** 30]);
    }
    const chosen = Number(BigInt(sequences) * sequenceBytes(entry.groups, positions, itemsize)) / 2 ** 30;
    const top_value = Math.max(chosen, points[points.length - 1][1]) * 1.05 || 1;
    const x = function (k) { return left + (k - first) / (last - first) * (width - left - right); };
    const y = function (v) { return height - bottom - v / top_value * (height - top - bottom); };
    chart.setAttribute("viewBox", "0 0 " + width + " " + height);
    chart.appendChild(svg("line", {x1: left, y1: height - bottom, x2: width - right, y2: height - bottom, class: "kv-axis"}));
    chart.appendChild(svg("line", {x1: left, y1: top, x2: left, y2: height - bottom, class: "kv-axis"}));
    for (let k = first; k <= last; k += 2) {
      const n = 2 ** k;
      const label = n >= 1048576 ? (n / 1048576) + "M" : (n / 1024) + "k";
      chart.appendChild(svg("text", {x: x(k), y: height - bottom + 16, class: "kv-tick", "text-anchor": "middle"}, label));
    }
    for (let i = 0; i <= 4; i++) {
      const v = top_value * i / 4;
      chart.appendChild(svg("text", {x: left - 6, y: y(v) + 4, class: "kv-tick", "text-anchor": "end"}, v.toFixed(v < 10 ? 1 : 0)));
    }
    chart.appendChild(svg("text", {x: (left + width - right) / 2, y: height - 4, class: "kv-label", "text-anchor": "middle"},
      "context (positions, log scale)"));
    chart.appendChild(svg("text", {x: 14, y: (top + height - bottom) / 2, class: "kv-label", "text-anchor": "middle",
      transform: "rotate(-90 14 " + (top + height - bottom) / 2 + ")"}, "GiB"));
    chart.appendChild(svg("polyline", {points: points.map(function (p) { return x(p[0]) + "," + y(p[1]); }).join(" "),
      class: "kv-line"}));
    chart.appendChild(svg("circle", {cx: x(Math.log2(positions)), cy: y(chosen), r: 5, class: "kv-point"}));
    chart.setAttribute("aria-label", entry.name + ": cache in GiB against context, " + sequences + " sequence(s), " +
      dtype.value + "; " + gib(BigInt(sequences) * sequenceBytes(entry.groups, positions, itemsize)) + " GiB at " +
      positions.toLocaleString("en-US") + " positions");
  }

  function update() {
    const entry = data.models[Number(model.value)];
    const [positions, contextError] = readCount(context, "context", MAX_CONTEXT);
    const [sequences, batchError] = readCount(batch, "batch", MAX_BATCH);
    const error = contextError || batchError;
    lines.textContent = "";
    if (error) {
      result.textContent = error;
      result.setAttribute("data-bytes", "");
      result.classList.add("kv-error");
      return;
    }
    result.classList.remove("kv-error");
    const itemsize = data.dtypes[dtype.value];
    const bytes = BigInt(sequences) * sequenceBytes(entry.groups, positions, itemsize);
    result.setAttribute("data-bytes", bytes.toString());
    result.textContent = entry.name + ", " + positions.toLocaleString("en-US") + " positions, batch " + sequences +
      ", " + dtype.value + ": " + gib(bytes) + " GiB (" + bytes.toLocaleString("en-US") + " bytes)";
    entry.lines.forEach(function (line) {
      const item = document.createElement("li");
      item.textContent = line;
      lines.appendChild(item);
    });
    draw(entry, positions, sequences, itemsize);
  }

  form.addEventListener("input", update);
  form.addEventListener("submit", function (event) { event.preventDefault(); update(); });
  update();
})();
