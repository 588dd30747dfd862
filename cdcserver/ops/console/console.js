// The cdcserver web console (docs/admin.md): the admin API's views and actions in a browser.
//
// Plain JavaScript, no build step, nothing fetched from elsewhere: the service's
// Content-Security-Policy allows scripts and styles from its own origin only, so nothing here
// is inline (no style attributes, no event handler attributes). Everything the API returns is
// put into the page as text (textContent, attributes), never parsed as HTML: table names, user
// names and error messages are whatever somebody chose them to be.
"use strict";

const TOKEN_KEY = "cdcserver.admin.token";
const LAG_KEY = "cdcserver.console.lag"; // the chart's samples, kept across a reload
// Relative to /console/: a proxy that mounts the service under a prefix keeps working.
const API = "../api/v1";
const REFRESH_MS = 2000;
const SLOW_REFRESH_MS = 10000; // tables and dumps, while another page shows (the tab counts)
const LAG_WINDOW_MS = 5 * 60 * 1000;
const OK_MESSAGE_MS = 10000;
const PAGES = ["overview", "clients", "tables", "dumps"];
const NONE = "\u2013"; // an en dash: nothing to show

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  page: "overview",
  generation: 0, // bumped when polling (re)starts: a stale loop stops rescheduling itself
  timer: null,
  fetchedAt: {}, // endpoint -> Date.now() of its last answer
  refreshes: 0, // refreshes started
  shown: {}, // endpoint -> the number of the refresh whose answer it shows
  skew: 0, // server clock minus this browser's, from replication.time
  lag: storedLag(), // {t: ms, v: seconds or null}, the last LAG_WINDOW_MS
  clients: new Map(), // id -> the client's document, for confirmations
  refused: false,
};

// -- small DOM helpers -------------------------------------------------------------------

const $ = (selector) => document.querySelector(selector);

/** An element with attributes (set as attributes, never as HTML) and children (nodes, or
 * strings made text nodes). */
function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== null && value !== undefined && value !== false) node.setAttribute(name, value);
  }
  node.append(...children.filter((c) => c !== null && c !== undefined));
  return node;
}

const SVG_NS = "http://www.w3.org/2000/svg";

function svg(tag, attributes = {}, text = null) {
  const node = document.createElementNS(SVG_NS, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  if (text !== null) node.textContent = text;
  return node;
}

function setText(selector, text) {
  $(selector).textContent = text;
}

// -- formatting --------------------------------------------------------------------------

const INTEGER = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const ONE_DECIMAL = new Intl.NumberFormat(undefined, {
  minimumFractionDigits: 1, maximumFractionDigits: 1,
});
const BYTE_UNITS = ["KiB", "MiB", "GiB", "TiB", "PiB"];

function integer(n) {
  return typeof n === "number" ? INTEGER.format(n) : NONE;
}

function bytes(n) {
  if (typeof n !== "number") return NONE;
  if (Math.abs(n) < 1024) return `${INTEGER.format(n)} B`;
  let value = n;
  let unit = -1;
  while (Math.abs(value) >= 1024 && unit < BYTE_UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${ONE_DECIMAL.format(value)} ${BYTE_UNITS[unit]}`;
}

function seconds(s) {
  if (typeof s !== "number") return NONE;
  if (s < 10) return `${ONE_DECIMAL.format(s)} s`;
  return duration(s * 1000);
}

/** A span of time the way a person says it: 42 s, 3 min 12 s, 2 h 5 min, 3 d 4 h. */
function duration(ms) {
  const total = Math.max(0, Math.round(ms / 1000));
  const [d, h, m, s] = [
    Math.floor(total / 86400), Math.floor(total / 3600) % 24, Math.floor(total / 60) % 60,
    total % 60,
  ];
  if (d) return `${d} d ${h} h`;
  if (h) return `${h} h ${m} min`;
  if (m) return `${m} min ${s} s`;
  return `${s} s`;
}

/** An ISO 8601 time, shown in UTC as the API gives it: 2026-11-28 17:30:00. */
function time(iso) {
  if (!iso) return NONE;
  const when = new Date(iso);
  if (Number.isNaN(when.getTime())) return String(iso);
  return when.toISOString().slice(0, 19).replace("T", " ");
}

/** How long ago an ISO time was, on the server's clock. */
function ago(iso) {
  const when = iso ? new Date(iso).getTime() : NaN;
  if (Number.isNaN(when)) return NONE;
  return `${duration(Date.now() + state.skew - when)} ago`;
}

// -- the API -----------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(method, path, body) {
  const headers = { Authorization: `Bearer ${state.token}`, Accept: "application/json" };
  const request = { method, headers, cache: "no-store" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    request.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(API + path, request);
  } catch (error) {
    throw new ApiError(0, `the service does not answer (${error.message})`);
  }
  let answer = null;
  try {
    answer = await response.json();
  } catch {
    // not JSON (a proxy's error page): the status says enough
  }
  if (response.status === 401) {
    tokenRefused();
    throw new ApiError(401, "the token was refused");
  }
  if (!response.ok) {
    const why = answer && typeof answer.error === "string" ? answer.error : "";
    throw new ApiError(response.status, why || `HTTP ${response.status} ${response.statusText}`);
  }
  return answer;
}

// -- the token ---------------------------------------------------------------------------

function showLogin(why) {
  stopPolling();
  $("#login").hidden = false;
  $("#login-error").hidden = !why;
  $("#login-error").textContent = why || "";
  $("#token-input").value = "";
  $("#token-input").focus();
  setStatus("idle", "not signed in");
}

function tokenRefused() {
  if (state.refused) return;
  state.refused = true;
  state.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  closeConfirm(false);
  showLogin("The service answered 401: the token was refused. Enter the content of the " +
            "service's [admin] token_file.");
}

function signIn(event) {
  event.preventDefault();
  const token = $("#token-input").value.trim();
  // A header value must be ASCII, and the service's tokens are printable ASCII.
  if (!/^[\x21-\x7e]+$/.test(token)) {
    $("#login-error").textContent = "A token is printable ASCII characters, without spaces.";
    $("#login-error").hidden = false;
    return;
  }
  state.token = token;
  state.refused = false;
  sessionStorage.setItem(TOKEN_KEY, token);
  $("#login").hidden = true;
  startPolling();
}

function signOut() {
  state.token = null;
  sessionStorage.removeItem(TOKEN_KEY);
  showLogin(null);
}

// -- polling -----------------------------------------------------------------------------

function startPolling() {
  stopPolling();
  const generation = state.generation;
  const tick = async () => {
    const started = Date.now();
    await refresh();
    if (generation !== state.generation || !state.token) return;
    state.timer = setTimeout(tick, Math.max(0, REFRESH_MS - (Date.now() - started)));
  };
  tick();
}

function stopPolling() {
  state.generation += 1;
  clearTimeout(state.timer);
  state.timer = null;
}

/** The endpoints this refresh reads: the replication (the lag chart samples it) and the
 * clients always, the tables and dumps while their page shows (or now and then, for the tab
 * counts: the tables' record counts read the store). */
function endpointsDue() {
  const due = ["replication", "clients"];
  for (const name of ["tables", "dumps"]) {
    const last = state.fetchedAt[name] || 0;
    if (state.page === name || Date.now() - last >= SLOW_REFRESH_MS) due.push(name);
  }
  return due;
}

const RENDER = {
  replication: renderReplication,
  clients: (doc) => renderClients(doc.clients || []),
  tables: (doc) => renderTables(doc.tables || []),
  dumps: renderDumps,
};

async function refresh() {
  if (!state.token) return;
  // A refresh started after an action may overtake the one before it: each endpoint shows
  // the answer to its latest request only, never an older one that arrived later.
  const number = ++state.refreshes;
  const names = endpointsDue();
  const answers = await Promise.allSettled(names.map((name) => api("GET", `/${name}`)));
  if (!state.token) return; // refused meanwhile
  let failure = null;
  names.forEach((name, i) => {
    const answer = answers[i];
    if (answer.status === "rejected") {
      failure = failure || answer.reason;
      if (name === "replication") sampleLag(null);
    } else if (number > (state.shown[name] || 0)) {
      state.shown[name] = number;
      state.fetchedAt[name] = Date.now();
      RENDER[name](answer.value);
    }
  });
  if (number < state.refreshes && !failure) return; // a newer one reports the status
  if (failure) {
    setStatus("error", `no answer at ${clock(new Date())}: ${failure.message}`);
  } else {
    setStatus("ok", `updated ${clock(new Date())}`);
  }
}

function clock(date) {
  return date.toTimeString().slice(0, 8);
}

function setStatus(kind, text) {
  const status = $("#status");
  status.dataset.state = kind;
  status.textContent = text;
  status.title = text;
}

// -- overview ----------------------------------------------------------------------------

const STATE_TONES = {
  replicating: "ok", starting: "warn", connecting: "warn", stopping: "warn",
  paused: "bad", stopped: "bad",
};

function renderReplication(r) {
  const server = r.time ? new Date(r.time).getTime() : NaN;
  if (!Number.isNaN(server)) state.skew = server - Date.now();

  const badge = $("#rep-state");
  badge.textContent = r.state || NONE;
  badge.dataset.tone = STATE_TONES[r.state] || "";
  setText("#rep-measured", r.time ? `as of ${time(r.time)} UTC` : "");

  const lag = typeof r.lag_seconds === "number" ? r.lag_seconds : null;
  setText("#rep-lag", lag === null ? "not measured" : seconds(lag));
  setText("#rep-lag-transactions", typeof r.lag_transactions === "number"
    ? `${integer(r.lag_transactions)} transactions behind` : "");

  const source = r.source || {};
  setText("#rep-source", source.current || "none");
  const refused = Array.isArray(source.refused) && source.refused.length
    ? ` \u00b7 refused: ${source.refused.join("; ")}` : "";
  setText("#rep-sources", `${integer(source.sources)} configured \u00b7 ` +
          `${integer(source.switches)} switches${refused}`);

  setText("#rep-position", r.position || "(nothing applied yet)");
  setText("#rep-last-commit", r.last_commit
    ? `last commit ${time(r.last_commit)} UTC (${ago(r.last_commit)})` : "no commit yet");
  setText("#rep-transactions", integer(r.transactions));
  const queue = r.queue || {};
  setText("#rep-queue", `queue ${bytes(queue.bytes)} of ${bytes(queue.capacity)}`);

  const problems = Array.isArray(r.problems) ? r.problems : [];
  $("#rep-problems").hidden = problems.length === 0;
  $("#rep-problem-list").replaceChildren(...problems.map((p) => el("li", {}, String(p))));

  renderQuarantine(Array.isArray(r.quarantined) ? r.quarantined : []);
  sampleLag(lag);
}

function renderQuarantine(quarantined) {
  syncRows($("#quarantine-table"), quarantined, (q) => q.table, (q, row) => {
    row.dataset.table = q.table;
    const resync = actionButton("resync", "Resync", { "data-table": q.table });
    resync.disabled = Boolean(q.resyncing);
    return [
      cell("name", q.table),
      cell("", q.cause || NONE),
      cell("mono nowrap", q.since || NONE),
      cell("nowrap", time(q.at), q.at ? ago(q.at) : null),
      cell("", tag(q.resyncing ? "resyncing" : "waiting", q.resyncing ? "warn" : "")),
      actionsCell(resync),
    ];
  });
}

function renderClientSummary(clients) {
  const streaming = clients.filter((c) => c.phase === "streaming").length;
  const dumping = clients.filter((c) => c.phase === "dump").length;
  setText("#rep-clients", integer(clients.length));
  setText("#rep-clients-detail", `${integer(streaming)} streaming \u00b7 ${integer(dumping)} ` +
          "reading dumps");
  setText("#count-clients", integer(clients.length));
}

// -- the lag chart ------------------------------------------------------------------------

function storedLag() {
  try {
    const samples = JSON.parse(sessionStorage.getItem(LAG_KEY) || "[]");
    const since = Date.now() - LAG_WINDOW_MS;
    return samples.filter((s) => typeof s.t === "number" && s.t >= since &&
                                 (s.v === null || typeof s.v === "number"));
  } catch {
    return []; // unreadable: start a new chart
  }
}

function sampleLag(value) {
  const now = Date.now();
  state.lag.push({ t: now, v: value });
  while (state.lag.length && state.lag[0].t < now - LAG_WINDOW_MS) state.lag.shift();
  sessionStorage.setItem(LAG_KEY, JSON.stringify(state.lag));
  const values = state.lag.map((s) => s.v).filter((v) => v !== null);
  setText("#lag-now", values.length
    ? `now ${seconds(value)} \u00b7 highest ${seconds(Math.max(...values))} over the window`
    : "not measured yet");
  if (state.page === "overview") drawLagChart();
}

/** The smallest 1, 2 or 5 times a power of ten that is at least x. */
function niceStep(x) {
  const power = 10 ** Math.floor(Math.log10(x));
  return [1, 2, 5, 10].map((m) => m * power).find((step) => step >= x - 1e-12);
}

function drawLagChart() {
  const box = $("#lag-chart");
  const width = Math.max(box.clientWidth, 300);
  const height = Math.max(box.clientHeight, 120);
  const pad = { left: 56, right: 18, top: 12, bottom: 28 };
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const end = Date.now();
  const start = end - LAG_WINDOW_MS;
  const values = state.lag.map((s) => s.v).filter((v) => v !== null);
  const step = niceStep(Math.max(...values, 0.4) / 4);
  const top = step * 4;
  const x = (t) => pad.left + ((t - start) / LAG_WINDOW_MS) * plotW;
  const y = (v) => pad.top + plotH - (Math.min(v, top) / top) * plotH;

  const chart = svg("svg", {
    viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": "replication lag in seconds over the last five minutes",
  });
  for (let i = 0; i <= 4; i += 1) {
    const value = step * i;
    chart.append(
      svg("line", { class: i ? "gridline" : "axis", x1: pad.left, x2: width - pad.right,
                    y1: y(value), y2: y(value) }),
      svg("text", { class: "label", x: pad.left - 8, y: y(value) + 4, "text-anchor": "end" },
          `${step < 1 ? ONE_DECIMAL.format(value) : INTEGER.format(value)} s`),
    );
  }
  for (let minutes = 5; minutes >= 0; minutes -= 1) {
    const at = x(end - minutes * 60000);
    chart.append(
      svg("line", { class: "axis", x1: at, x2: at, y1: pad.top + plotH, y2: pad.top + plotH + 4 }),
      svg("text", { class: "label", x: at, y: height - 8,
                    "text-anchor": minutes === 0 ? "end" : minutes === 5 ? "start" : "middle" },
          minutes ? `\u2212${minutes} min` : "now"),
    );
  }
  chart.append(svg("line", { class: "axis", x1: pad.left, x2: pad.left, y1: pad.top,
                             y2: pad.top + plotH }));
  for (const run of lagRuns(start)) {
    const points = run.map((s) => `${x(s.t).toFixed(1)},${y(s.v).toFixed(1)}`);
    const base = y(0).toFixed(1);
    const first = x(run[0].t).toFixed(1);
    const last = x(run[run.length - 1].t).toFixed(1);
    const outline = `${first},${base} ${points.join(" ")} ${last},${base}`;
    chart.append(svg("polygon", { class: "area", points: outline }),
                 svg("polyline", { class: "line", points: points.join(" ") }));
  }
  if (!values.length) {
    chart.append(svg("text", { class: "nodata", x: pad.left + plotW / 2, y: pad.top + plotH / 2,
                               "text-anchor": "middle" }, "no lag measured yet"));
  }
  box.replaceChildren(chart);
}

/** The samples in runs without a gap: an unmeasured lag or a missed refresh breaks the
 * line rather than drawing a slope nobody measured. */
function lagRuns(start) {
  const runs = [];
  let run = [];
  let previous = null;
  for (const sample of state.lag.filter((s) => s.t >= start)) {
    const gap = previous && sample.t - previous.t > 3 * REFRESH_MS;
    if (sample.v === null || gap) {
      if (run.length) runs.push(run);
      run = [];
    }
    if (sample.v !== null) run.push(sample);
    previous = sample;
  }
  if (run.length) runs.push(run);
  // a lone sample is a dot-sized line
  return runs.map((r) => (r.length === 1 ? [r[0], { t: r[0].t + 500, v: r[0].v }] : r));
}

// -- table rows ---------------------------------------------------------------------------

/** Brings a table's rows in line with ``items``, one row per key: a row that stays is
 * updated in place (its buttons stay the same elements, a click lands on what it aimed
 * at), new ones are added, gone ones removed. ``cells(item, row)`` gives the row's cells. */
function syncRows(table, items, keyOf, cells) {
  const body = table.tBodies[0];
  const existing = new Map([...body.rows].map((row) => [row.dataset.key, row]));
  let previous = null;
  for (const item of items) {
    const key = String(keyOf(item));
    let row = existing.get(key);
    if (row) {
      existing.delete(key);
    } else {
      row = el("tr", { "data-key": key });
    }
    fillRow(row, cells(item, row));
    const wanted = previous ? previous.nextSibling : body.firstChild;
    if (row !== wanted) body.insertBefore(row, wanted);
    previous = row;
  }
  for (const row of existing.values()) row.remove();
  table.hidden = items.length === 0;
  document.querySelector(`[data-empty-for="${table.id}"]`).hidden = items.length > 0;
  table.dataset.loaded = "true";
}

/** Replaces a row's cells, keeping an action cell's buttons when they are the same ones. */
function fillRow(row, cells) {
  cells.forEach((fresh, i) => {
    const old = row.cells[i];
    if (!old) {
      row.append(fresh);
    } else if (fresh.dataset.actions !== undefined && old.dataset.actions !== undefined) {
      syncButtons(old, fresh);
    } else if (old.outerHTML !== fresh.outerHTML) { // (read only: compares the markup)
      row.replaceChild(fresh, old);
    }
  });
  while (row.cells.length > cells.length) row.deleteCell(-1);
}

function syncButtons(old, fresh) {
  const kept = [...old.children];
  const wanted = [...fresh.children];
  const same = kept.length === wanted.length &&
    kept.every((b, i) => b.dataset.action === wanted[i].dataset.action);
  if (!same) {
    old.replaceChildren(...wanted);
    return;
  }
  kept.forEach((b, i) => {
    if (!b.dataset.busy) b.disabled = wanted[i].disabled;
    b.title = wanted[i].title;
  });
}

function cell(className, text, sub = null, title = null) {
  const td = el("td", { class: className || null, title });
  td.append(text);
  if (sub !== null && sub !== undefined && sub !== "") {
    td.append(el("span", { class: "sub" }, String(sub)));
  }
  return td;
}

function tag(text, tone) {
  return el("span", { class: "tag", "data-tone": tone || null }, text);
}

function actionButton(action, label, data, danger = false) {
  return el("button", { type: "button", class: danger ? "small-button danger" : "small-button",
                        "data-action": action, ...data }, label);
}

function actionsCell(...buttons) {
  return el("td", { class: "actions", "data-actions": "" }, ...buttons);
}

// -- clients ------------------------------------------------------------------------------

const PHASE_TONES = { streaming: "ok", dump: "ok", login: "warn", register: "warn",
                      closing: "bad" };

function renderClients(clients) {
  state.clients = new Map(clients.map((c) => [String(c.id), c]));
  renderClientSummary(clients);
  syncRows($("#clients-table"), clients, (c) => c.id, (c, row) => {
    row.dataset.clientId = String(c.id);
    const position = c.position || null;
    const behind = c.behind || null;
    return [
      cell("num", String(c.id)),
      cell("mono nowrap", c.address || NONE),
      cell("name", c.user || NONE, c.uuid ? `uuid ${c.uuid}` : null),
      cell("", c.format || NONE, c.dialect),
      cell("", tag(c.phase || NONE, PHASE_TONES[c.phase])),
      cell("name", c.reading || NONE, c.kind, c.request),
      position
        ? cell("mono nowrap", `v${position.version} @ ${integer(position.offset)}`,
               position.gtid || "no transaction sent yet",
               `version ${position.version}, byte offset ${position.offset}`)
        : cell("", NONE),
      behind
        ? cell("num", bytes(behind.bytes), seconds(behind.seconds),
               `${integer(behind.bytes)} bytes stored past the position`)
        : cell("num", NONE),
      cell("num", integer(c.records_sent), bytes(c.bytes_sent) + " sent"),
      cell("num", `${bytes(c.bytes_per_second)}/s`),
      cell("", c.connected_at ? duration(Date.now() + state.skew -
                                          new Date(c.connected_at).getTime()) : NONE,
           c.connected_at ? `since ${time(c.connected_at).slice(11)} UTC` : null, c.connected_at),
      actionsCell(actionButton("kick", "Disconnect", { "data-client-id": String(c.id) }, true)),
    ];
  });
}

// -- tables -------------------------------------------------------------------------------

function renderTables(tables) {
  setText("#count-tables", integer(tables.length));
  syncRows($("#tables-table"), tables, (t) => t.table, (t, row) => {
    row.dataset.table = t.table;
    const versions = Array.isArray(t.versions) ? t.versions : [];
    const newest = versions.length ? versions[versions.length - 1] : null;
    const q = t.quarantined;
    const buttons = [];
    if (q) {
      const resync = actionButton("resync", "Resync", { "data-table": t.table });
      resync.disabled = Boolean(q.resyncing);
      buttons.push(resync);
    }
    buttons.push(actionButton("dump", "Dump", { "data-table": t.table }));
    return [
      cell("name", t.table),
      cell("num", integer(versions.length), newest ? `newest v${newest.version}` : null,
           versions.map((v) => `${v.file}: ${v.bytes} bytes${v.sealed ? ", sealed" : ""}`)
             .join("\n")),
      cell("num", integer(t.records), null,
           t.records === null ? "not counted (a store written before it counted)" : null),
      cell("num", bytes(t.bytes), null, `${integer(t.bytes)} bytes`),
      cell("mono nowrap", t.last_gtid || NONE),
      cell("nowrap", time(t.last_commit), t.last_commit ? ago(t.last_commit) : null),
      q ? cell("", tag(q.resyncing ? "resyncing" : "quarantined", q.resyncing ? "warn" : "bad"),
               q.cause, `since ${q.since}: ${q.cause}`)
        : cell("", tag("whole", "ok")),
      cell("num", integer(t.clients)),
      actionsCell(...buttons),
    ];
  });
}

// -- dumps --------------------------------------------------------------------------------

const TAKING_TONES = { running: "ok", queued: "", failed: "bad" };

function renderDumps(doc) {
  const dumps = Array.isArray(doc.dumps) ? doc.dumps : [];
  const taking = Array.isArray(doc.taking) ? doc.taking : [];
  setText("#count-dumps", integer(dumps.length));
  syncRows($("#dumps-table"), dumps, (d) => d.name, (d, row) => {
    row.dataset.dumpName = d.name;
    row.dataset.table = d.table;
    const readers = Array.isArray(d.readers) ? d.readers : [];
    return [
      cell("mono", d.name),
      cell("name", d.table),
      cell("num", bytes(d.bytes), null, `${integer(d.bytes)} bytes`),
      cell("num", integer(d.rows)),
      cell("nowrap", time(d.created), d.created ? ago(d.created) : null),
      cell("mono nowrap", d.gtid || NONE),
      cell("", readers.length ? readers.map((id) => `client ${id}`).join(", ") : NONE),
    ];
  });
  syncRows($("#taking-table"), taking, (p) => p.ref, (p, row) => {
    row.dataset.table = p.ref;
    row.dataset.state = p.state;
    return [
      cell("name", p.ref),
      cell("", tag(p.state, TAKING_TONES[p.state])),
      progressCell(p),
      cell("num", integer(p.rows),
           p.estimated_rows ? `of about ${integer(p.estimated_rows)}` : "estimate unknown"),
      cell("nowrap", time(p.started), p.started ? ago(p.started) : null),
      cell("error-text", p.error || ""),
    ];
  });
}

function progressCell(p) {
  const estimated = Number(p.estimated_rows) || 0;
  const rows = Number(p.rows) || 0;
  const bar = el("progress", { max: String(Math.max(estimated, rows, 1)) });
  // without an estimate a running dump's bar is indeterminate (it moves, it has no end)
  if (estimated || p.state !== "running") bar.value = p.state === "queued" ? 0 : rows;
  const percent = estimated ? `${Math.min(100, Math.floor((rows / estimated) * 100))} %` : "";
  return el("td", { class: "progress-col", title: percent || null }, bar);
}

// -- actions ------------------------------------------------------------------------------

const ACTIONS = { kick: kickClient, resync: resyncTable, dump: dumpTable };

async function onAction(event) {
  const button = event.target.closest("button[data-action]");
  if (!button || !ACTIONS[button.dataset.action]) return;
  await ACTIONS[button.dataset.action](button);
}

/** Runs one action's request with its button held down, reporting the outcome. */
async function perform(button, request, success, failure) {
  button.dataset.busy = "1";
  button.disabled = true;
  try {
    const answer = await request();
    showMessage("ok", success(answer));
    refreshSoon();
    return true;
  } catch (error) {
    if (error.status !== 401) showMessage("error", `${failure}: ${error.message}`);
    return false;
  } finally {
    delete button.dataset.busy;
    button.disabled = false;
  }
}

async function kickClient(button) {
  const id = button.dataset.clientId;
  const client = state.clients.get(id) || {};
  const who = [client.user ? `user ${client.user}` : null, client.address,
               client.reading ? `reading ${client.reading}` : null].filter(Boolean).join(", ");
  const sure = await confirmAction(`Disconnect client ${id}?`,
    `Client ${id}${who ? ` (${who})` : ""} receives "ERR FORBIDDEN disconnected by an ` +
    "administrator\" and its connection closes. It may connect again.", "Disconnect");
  if (!sure) return;
  const done = await perform(button, () => api("DELETE", `/clients/${encodeURIComponent(id)}`),
    () => `Client ${id} was disconnected.`, `Could not disconnect client ${id}`);
  if (done) button.closest("tr")?.setAttribute("data-gone", "");
}

async function resyncTable(button) {
  const ref = button.dataset.table;
  const sure = await confirmAction(`Resync ${ref}?`,
    `The service takes ${ref} again from the source and starts a new version of its stream; ` +
    "its clients continue from there.", "Resync");
  if (!sure) return;
  await perform(button,
    () => api("POST", `/tables/${encodeURIComponent(ref)}/resync`),
    (answer) => `Resyncing ${answer.resyncing || ref}.`, `Could not resync ${ref}`);
}

async function dumpTable(button) {
  const ref = button.dataset.table;
  const sure = await confirmAction(`Dump ${ref}?`,
    `The service takes a dump of ${ref} from the source, without stopping replication. ` +
    "Large tables take a while: the Dumps page shows the progress.", "Take the dump");
  if (!sure) return;
  await perform(button, () => api("POST", "/dumps", { table: ref }), (answer) => {
    const queued = Array.isArray(answer.queued) ? answer.queued : [];
    const text = queued.length ? `Dump of ${queued.join(", ")} queued: `
      : `A dump of ${ref} is under way already: `;
    return [text, el("a", { href: "#dumps" }, "follow it on the Dumps page"), "."];
  }, `Could not dump ${ref}`);
}

async function reloadUsers(event) {
  await perform(event.currentTarget, () => api("POST", "/users/reload"),
    (answer) => `The users file was read again: ${integer(answer.users)} ` +
      `user${answer.users === 1 ? "" : "s"}.`,
    "Could not reload the users file");
}

function refreshSoon() {
  if (state.token) startPolling();
}

// -- the confirmation dialog --------------------------------------------------------------

let answerConfirm = null; // resolves the open confirmation's promise

/** Asks in the page (not window.confirm: it blocks the page and cannot be styled), resolving
 * to true for yes. */
function confirmAction(title, text, yes) {
  closeConfirm(false);
  setText("#confirm-title", title);
  setText("#confirm-text", text);
  setText("#confirm-yes", yes);
  const opener = document.activeElement;
  $("#confirm").hidden = false;
  $("#confirm-no").focus(); // the safe choice has the focus: Enter does nothing harmful
  return new Promise((resolve) => {
    answerConfirm = (answer) => {
      answerConfirm = null;
      $("#confirm").hidden = true;
      if (opener && document.contains(opener)) opener.focus();
      resolve(answer);
    };
  });
}

function closeConfirm(answer) {
  if (answerConfirm) answerConfirm(answer);
}

// -- messages -----------------------------------------------------------------------------

function showMessage(kind, content) {
  const parts = Array.isArray(content) ? content : [content];
  const close = el("button", { type: "button", "aria-label": "Dismiss", title: "Dismiss" },
                   "\u00d7");
  const message = el("div", { class: "message", "data-kind": kind,
                              role: kind === "error" ? "alert" : "status" },
                     el("span", { class: "text" }, ...parts), close);
  close.addEventListener("click", () => message.remove());
  const box = $("#messages");
  box.append(message);
  while (box.children.length > 5) box.firstElementChild.remove();
  if (kind !== "error") setTimeout(() => message.remove(), OK_MESSAGE_MS);
}

// -- pages --------------------------------------------------------------------------------

function showPage() {
  const asked = location.hash.slice(1);
  const page = PAGES.includes(asked) ? asked : "overview";
  state.page = page;
  document.body.dataset.page = page;
  for (const section of document.querySelectorAll("main > section")) {
    section.hidden = section.dataset.page !== page;
  }
  for (const tab of document.querySelectorAll("#tabs a")) {
    if (tab.dataset.tab === page) tab.setAttribute("aria-current", "page");
    else tab.removeAttribute("aria-current");
  }
  if (page === "overview") drawLagChart();
  refreshSoon();
}

function start() {
  $("#login-form").addEventListener("submit", signIn);
  $("#sign-out").addEventListener("click", signOut);
  $("#reload-users").addEventListener("click", reloadUsers);
  $("#confirm-yes").addEventListener("click", () => closeConfirm(true));
  $("#confirm-no").addEventListener("click", () => closeConfirm(false));
  $("#confirm").addEventListener("click", (event) => {
    if (event.target === event.currentTarget) closeConfirm(false); // the backdrop
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape") closeConfirm(false);
  });
  document.addEventListener("click", onAction);
  window.addEventListener("hashchange", showPage);
  window.addEventListener("resize", () => {
    if (state.page === "overview") drawLagChart();
  });
  showPage();
  if (!state.token) showLogin(null);
}

start();
