// gpuscope tab for TensorBoard: a run picker and the dashboard's panels.
// Every string from a run or trace is set with textContent, never parsed as markup.
// The label colours come with each report (gpuscope's vocabulary), not from here.

function el(tag, attrs = {}, text = null) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== null) node.textContent = text;
  return node;
}

async function getJSON(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  return response.json();
}

function loadPlotly() {
  if (window.Plotly) return Promise.resolve();
  return new Promise((resolve, reject) => {
    const s = el("script", {src: "./plotly.min.js"});
    s.onload = resolve;
    s.onerror = () => reject(new Error("plotly.js failed to load"));
    document.head.appendChild(s);
  });
}

// plotly labels arrive HTML-escaped (plotly renders a few tags); show them as text
function unescape(text) {
  const t = document.createElement("textarea");
  t.innerHTML = text;  // a detached textarea decodes entities and runs nothing
  return t.value;
}

function opsTable(id, rows, nRanks) {
  const table = el("table", {id, class: "ops"});
  const head = el("tr");
  for (const h of ["name", "ms / step", "calls / step", "ranks"]) head.append(el("th", {}, h));
  table.append(head);
  for (const r of rows.slice(0, 10)) {
    const tr = el("tr");
    tr.append(el("td", {title: r.name}, r.name.length > 80 ? r.name.slice(0, 77) + "..." : r.name),
              el("td", {}, r.per_step_ms.toFixed(3)), el("td", {}, r.count_per_step.toFixed(2)),
              el("td", {}, `${r.ranks} of ${nRanks}`));
    table.append(tr);
  }
  return table;
}

function opsSection(report, words) {
  const ops = report.ops;
  if (!ops || !ops.ranks || !ops.ranks.length) return null;
  const box = el("div", {id: "ops"});
  box.append(el("h3", {}, "Ops and kernels"));
  for (const line of (words && words.ops_lines) || []) box.append(el("p", {class: "ops-line"}, line));
  const run = ops.run || {};
  for (const [key, title] of [["ops", "Top-level ops"], ["ranges", "record_function ranges"],
                              ["modules", "Modules (forward)"], ["kernels", "Kernels"]]) {
    if (run[key] && run[key].length) {
      box.append(el("h4", {}, title), opsTable(`ops-run-${key}`, run[key], ops.ranks.length));
    }
  }
  return box;
}

function summary(report, colors, words) {
  const box = el("div", {id: "summary"});
  const stall = report.stall || {};
  if (stall.text) {  // a run that hung says so first: who waits, who never came
    box.append(el("p", {class: "died", id: "stall"},
                  "The run stalled: " + stall.story));
  }
  (stall.pauses || []).slice(0, 3).forEach((p) => {
    box.append(el("p", {class: "meta"}, `Paused: rank ${p.rank} made no step for ` +
                  `${Math.round(p.lasted_s)} s at step ${p.step} (in ${p.in})`));
  });
  (report.died || []).forEach((d, i) => {  // a run that died says so first
    box.append(el("p", {class: "died", id: i ? undefined : "died"},
                  (i ? "Also died: " : "The run died: ") + d.text));
  });
  const verdict = el("div", {class: "verdict"});
  verdict.style.borderColor = colors[report.verdict] || "#333";
  const label = el("span", {class: "label"}, report.verdict);
  label.style.background = colors[report.verdict] || "#333";
  verdict.append(label, document.createTextNode(
      ` ${Math.round(100 * report.verdict_share)}% of step time, confidence ${report.confidence}` +
      ` (${report.ranks_analysed} of ${report.world_size} ranks, ${report.steps_analysed} steps,` +
      ` ${report.source})` + (words && words.also ? ` (${words.also})` : "")));
  box.append(verdict);
  if ((report.confidence_why || []).length) {  // why the confidence is what it is
    box.append(el("div", {class: "meta", id: "confidence-why"},
                  `confidence ${report.confidence}: ` + report.confidence_why.join("; ")));
  }
  if (words && words.throughput) box.append(el("p", {id: "throughput"}, "Throughput: " + words.throughput));
  if (words && words.energy) box.append(el("p", {id: "energy"}, "Energy: " + words.energy));
  if (report.straggler_details.length) {
    box.append(el("h3", {}, "Stragglers"));
    const ul = el("ul", {id: "stragglers"});
    for (const s of report.straggler_details) {
      ul.append(el("li", {}, `${s.probable ? "probably " : ""}rank ${s.rank}` +
                     `${s.host ? " on " + s.host : ""}: ` +
                     (s.probable ? `${s.probable}; ` : `${s.lateness}, `) +
                     `${s.excess_ms.toFixed(1)} ms busier per step, ` +
                     `mostly in ${s.cause}${s.cause_detail ? " (" + s.cause_detail + ")" : ""}` +
                     (words && words.straggler_ops && words.straggler_ops[String(s.rank)]
                      ? `; ${words.straggler_ops[String(s.rank)]}` : "")));
    }
    box.append(ul);
  }
  if (words && words.minor && words.minor.length) {
    box.append(el("h3", {}, "Minor stragglers"));
    const ul = el("ul", {id: "minor-stragglers"});
    for (const line of words.minor) ul.append(el("li", {}, line));
    box.append(ul);
  }
  if (words && words.straggler_floor && !(report.straggler_details || []).length) {
    box.append(el("p", {id: "straggler-floor"}, `Stragglers: none; ${words.straggler_floor}`));
  }
  if (words && words.not_ruled_out) {
    box.append(el("p", {id: "not-ruled-out"}, words.not_ruled_out));
  }
  if (words && words.jitter) box.append(el("p", {id: "jitter"}, words.jitter));
  const opsBox = opsSection(report, words);
  if (opsBox) box.append(opsBox);
  box.append(el("h3", {}, "Suggestions"));
  const ol = el("ol", {id: "suggestions"});
  for (const s of report.suggestions) {
    const li = el("li");
    li.append(el("b", {}, s.knob), document.createTextNode(`: ${s.current} → ${s.proposed} `),
              el("span", {class: "gain"}, `~${s.estimated_step_ms.toFixed(1)}` +
                 (s.estimated_step_ms_range ? ` (${s.estimated_step_ms_range[0].toFixed(1)}-` +
                  `${s.estimated_step_ms_range[1].toFixed(1)})` : "") + ` ms/step, ` +
                 `${s.gain_pct >= 0 ? "+" : ""}${Math.round(s.gain_pct)}% throughput`),
              el("div", {class: "why"}, s.why));
    ol.append(li);
  }
  if (report.suggestions.length) box.append(ol);
  else box.append(el("p", {id: "suggestions"}, report.verdict === "compute-bound"
      ? "No suggestion: the run is compute-bound, the healthy state."
      : "No suggestion: the warnings below say why."));
  if (report.warnings.length) {
    const det = el("details", {id: "warnings"});
    det.append(el("summary", {}, `${report.warnings.length} warning(s)`));
    const ul = el("ul");
    for (const w of report.warnings) ul.append(el("li", {}, w));
    det.append(ul);
    box.append(det);
  }
  return box;
}

async function showRun(run, main) {
  main.replaceChildren(el("p", {class: "dim"}, `analysing ${run} ...`));
  let payload;
  try {
    payload = await getJSON(`./report?run=${encodeURIComponent(run)}`);
  } catch (err) {
    main.replaceChildren(el("p", {class: "error"}, String(err)));
    return;
  }
  if (payload.error) {
    main.replaceChildren(el("p", {class: "error"}, unescape(payload.error)));
    return;
  }
  main.replaceChildren(summary(payload.report, payload.colors || {}, payload.words || {}));
  await loadPlotly();
  for (const {id, figure} of payload.figures) {
    const div = el("div", {id, class: "panel"});
    main.append(div);
    await window.Plotly.newPlot(div, figure.data, figure.layout,
                                {displaylogo: false, responsive: true});
  }
}

export async function render() {
  const style = el("style", {}, `body{font-family:system-ui,sans-serif;margin:16px;color:#222}
    .died{color:#b00020;font-weight:600}
    .verdict{border-left:6px solid;padding:8px 12px;font-size:17px;background:#fafafa}
    .label{color:#fff;padding:2px 8px;border-radius:4px;text-transform:uppercase;font-weight:bold}
    .gain{color:#2e7d32}.why{color:#555;font-size:13px}.dim{color:#666}.error{color:#b00}
    .panel{margin-top:16px}`);
  document.head.append(style);
  const bar = el("div", {id: "picker"});
  const select = el("select", {id: "run-select"});
  const refresh = el("button", {id: "refresh"}, "refresh");
  const main = el("div", {id: "main"});
  bar.append(el("label", {for: "run-select"}, "Run: "), select, refresh);
  document.body.append(bar, main);

  async function listRuns() {
    const {runs} = await getJSON("./runs");
    const current = select.value;
    select.replaceChildren(...runs.map(r => el("option", {value: r.run}, `${r.run} (${r.kind})`)));
    if (runs.some(r => r.run === current)) select.value = current;
    return runs;
  }
  const runs = await listRuns();
  if (!runs.length) {
    main.replaceChildren(el("p", {}, "No gpuscope run dirs or torch.profiler traces under the logdir."));
    return;
  }
  select.addEventListener("change", () => showRun(select.value, main));
  refresh.addEventListener("click", async () => { await listRuns(); showRun(select.value, main); });
  await showRun(select.value, main);
}
