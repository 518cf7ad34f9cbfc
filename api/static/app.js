// Hear a job while it is made: fetch segment 0 the moment it exists (?wait= long-poll), then the rest in
// order, keeping at most LOOKAHEAD segments fetched ahead of the one playing, scheduled back to back with
// the Web Audio API so there is no gap between sentences. A service that asks for an API key gets the one typed
// into the page (kept in localStorage) as "Authorization: Bearer" on every request, the event stream included:
// EventSource cannot send headers, so the stream is read with fetch() instead, and the key never goes in a URL.
"use strict";

const LOOKAHEAD = 2;
const WAIT_S = 30;
const KEY_STORAGE = "tts-api-key";
// How many times in a row the event stream may drop without delivering anything before the page gives up on it.
const SSE_RECONNECTS = 5;

const $ = (id) => document.getElementById(id);
let models = new Map();
let current = null;

// What happened, for people debugging and for tests: indices fetched and played (and both in the order
// they happened, in log), and whether all played.
window.ttsPlayback = { fetched: [], played: [], log: [], events: [], ended: false, jobId: null, error: null };

class ApiError extends Error {
  constructor(status, code, message, retryAfter = null) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter; // seconds, from a 503's or 429's Retry-After header
  }
}

function storedKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) ?? "";
  } catch {
    return ""; // storage refused (a private window's policy): the key lasts as long as the page
  }
}

function storeKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
  } catch {
    // as above: nothing kept, the field still holds it
  }
}

function apiKey() {
  return $("api-key").value.trim();
}

// The request headers, with the key when one is given.
function authHeaders(headers = {}) {
  const key = apiKey();
  return key ? { ...headers, Authorization: `Bearer ${key}` } : headers;
}

async function errorOf(response, fallback) {
  const body = await response.json().catch(() => null);
  const message = body?.error?.message ?? fallback ?? response.statusText;
  const retryAfter = Number.parseFloat(response.headers.get("Retry-After") ?? "");
  return new ApiError(response.status, body?.error?.code ?? "http_error", message, Number.isNaN(retryAfter) ? null : retryAfter);
}

function explain(error) {
  if (error instanceof ApiError && error.status === 401) {
    return apiKey()
      ? "the service refused this API key; check the API key field"
      : "this service needs an API key; enter it in the API key field";
  }
  return error.message;
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: authHeaders(options.headers) });
  if (!response.ok) throw await errorOf(response);
  return response.json();
}

// Read a server-sent event stream from a fetch() body: {event, id, data} per event, as EventSource would
// dispatch them (comments, the service's keep-alives, are skipped).
async function* readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = "";
  let event = "";
  let id = null;
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      const text = pending + value;
      // A CR at the end may be half of a CRLF whose LF is in the next chunk.
      const held = text.endsWith("\r") ? "\r" : "";
      const lines = text.slice(0, text.length - held.length).split(/\r\n|\r|\n/);
      pending = lines.pop() + held;
      for (const line of lines) {
        if (line === "") {
          if (data.length) yield { event: event || "message", id, data: data.join("\n") };
          event = "";
          id = null;
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        let field = colon < 0 ? "" : line.slice(colon + 1);
        if (field.startsWith(" ")) field = field.slice(1);
        if (name === "event") event = field;
        else if (name === "data") data.push(field);
        else if (name === "id" && !field.includes("\0")) id = field;
      }
    }
  } finally {
    reader.cancel().catch(() => {}); // the stream is left early after the last event
  }
}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

async function loadModels() {
  try {
    const registry = await api("v1/models");
    models = new Map(registry.data.map((m) => [m.id, m]));
    const select = $("model");
    select.replaceChildren();
    for (const model of registry.data) {
      const option = new Option(model.available ? model.id : `${model.id} (weights missing)`, model.id);
      option.disabled = !model.available;
      option.selected = model.id === registry.default;
      select.add(option);
    }
    fillVoices();
    $("play").disabled = false;
    setStatus("");
  } catch (error) {
    $("play").disabled = true;
    setStatus(`Could not load the models: ${explain(error)}`, true);
  }
}

function fillVoices() {
  const model = models.get($("model").value);
  const select = $("voice");
  select.replaceChildren();
  for (const voice of model?.voices ?? []) {
    select.add(new Option(voice, voice, false, voice === model.default_voice));
  }
}

class Playback {
  // A text stream's job (live typing) grows: its total is known once the stream closes (events say so).
  constructor(job, context) {
    this.job = job;
    this.open = Boolean(job.text_stream?.open);
    this.total = this.open ? Infinity : job.segments_total;
    this.context = context;
    this.abort = new AbortController();
    this.stopped = false;
    this.nextStart = 0;
    this.made = 0;
    this.audioSeconds = 0;
    this.waiters = [];
    this.state = { fetched: [], played: [], log: [], events: [], ended: false, jobId: job.id, error: null };
    window.ttsPlayback = this.state;
    $("made").max = $("heard").max = this.open ? 1 : this.total;
    this.follow();
  }

  // Server-sent events tell how far the service has got. After a dropped connection the stream is asked for
  // again with Last-Event-ID, so nothing is missed or repeated; an HTTP error ends it (as EventSource would).
  async follow() {
    let lastId = null;
    let failures = 0;
    while (!this.stopped) {
      let received = false;
      try {
        const headers = authHeaders({ Accept: "text/event-stream" });
        if (lastId !== null) headers["Last-Event-ID"] = lastId;
        const response = await fetch(this.job.urls.events, { headers, cache: "no-store", signal: this.abort.signal });
        if (!response.ok) {
          const error = await errorOf(response);
          console.warn(`event stream: ${explain(error)}`);
          return;
        }
        for await (const event of readEvents(response.body)) {
          received = true;
          if (event.id !== null) lastId = event.id;
          if (this.onEvent(event.event, event.data)) return;
        }
      } catch (error) {
        if (this.stopped) return;
      }
      failures = received ? 0 : failures + 1;
      if (failures > SSE_RECONNECTS) {
        console.warn("event stream: it kept dropping; the made bar stops here");
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, Math.min(200 * failures, 2000)));
    }
  }

  // Handle one event; return true for the last one.
  onEvent(name, data) {
    this.state.events.push(name);
    const payload = (() => {
      try {
        return JSON.parse(data);
      } catch {
        return {};
      }
    })();
    if (name === "segment") {
      this.made = payload.index + 1;
      if (this.open && payload.segments_total != null) this.total = payload.segments_total;
      this.show();
      this.waiters = this.waiters.filter((waiter) => !waiter());
      return false;
    }
    if (!["done", "failed", "canceled", "expired"].includes(name)) return false;
    if (this.open) {
      this.open = false;
      this.total = this.made;
      this.waiters = this.waiters.filter((waiter) => !waiter());
      if (this.state.played.length >= this.total) this.finish();
    }
    if (name === "done") {
      $("download").href = this.job.urls.audio;
      $("download").hidden = false;
    } else if (!this.stopped) {
      this.fail(new Error(`the job ${name}: ${payload.error ?? "no reason given"}`));
    }
    return true;
  }

  async run() {
    try {
      for (let index = 0; index < this.total && !this.stopped; index++) {
        await this.untilPlayed(index - LOOKAHEAD);
        if (this.open) await this.untilMade(index); // a live text: wait until the segment is planned and made
        if (this.stopped || index >= this.total) return;
        const data = await this.fetchSegment(index);
        this.state.fetched.push(index);
        this.state.log.push(`fetched ${index}`);
        const buffer = await this.context.decodeAudioData(data);
        this.schedule(buffer, index);
        this.show();
      }
    } catch (error) {
      if (!this.stopped) this.fail(error);
    }
  }

  async fetchSegment(index) {
    const url = `${this.job.urls.segment.replace("{index}", index)}?wait=${WAIT_S}`;
    for (;;) {
      try {
        const response = await fetch(url, { headers: authHeaders(), signal: this.abort.signal });
        if (response.ok) return await response.arrayBuffer();
        const error = await errorOf(response, `segment ${index} failed`);
        if (response.status !== 409 || error.code !== "not_ready") throw error;
      } catch (error) {
        if (this.stopped || error instanceof ApiError) throw error;
        await new Promise((resolve) => setTimeout(resolve, 1000)); // a dropped connection: try again shortly
      }
    }
  }

  // Start each segment where the previous one ends, so sentences follow without a gap.
  schedule(buffer, index) {
    const source = this.context.createBufferSource();
    source.buffer = buffer;
    source.connect(this.context.destination);
    const at = Math.max(this.context.currentTime + 0.05, this.nextStart);
    source.onended = () => {
      if (this.stopped) return;
      this.state.played.push(index);
      this.state.log.push(`played ${index}`);
      if (index === this.total - 1) this.finish();
      this.show();
      this.waiters = this.waiters.filter((waiter) => !waiter());
    };
    source.start(at);
    this.nextStart = at + buffer.duration;
    this.audioSeconds += buffer.duration;
  }

  untilMade(index) {
    return new Promise((resolve) => {
      const check = () => (this.stopped || this.made > index || !this.open ? (resolve(), true) : false);
      if (!check()) this.waiters.push(check);
    });
  }

  untilPlayed(count) {
    return new Promise((resolve) => {
      const check = () => (this.stopped || this.state.played.length >= count ? (resolve(), true) : false);
      if (!check()) this.waiters.push(check);
    });
  }

  show() {
    if (this.total !== Infinity) $("made").max = $("heard").max = this.total;
    $("made").value = this.made;
    $("heard").value = this.state.played.length;
    if (this.state.error || this.stopped) return;
    const verb = this.state.ended ? "Finished" : "Playing";
    setStatus(
      `${verb}: made ${this.made}/${this.total === Infinity ? "…" : this.total} · fetched ${this.state.fetched.length} · ` +
        `played ${this.state.played.length} · ${this.audioSeconds.toFixed(1)} s of audio`,
    );
  }

  finish() {
    this.state.ended = true;
    $("stop").disabled = true;
    this.context.close();
  }

  fail(error) {
    this.state.error = explain(error);
    setStatus(`Stopped: ${this.state.error}`, true);
    this.stop();
  }

  stop() {
    if (this.stopped) return;
    this.stopped = true;
    this.abort.abort(); // ends the segment fetches and the event stream
    this.waiters.forEach((waiter) => waiter());
    this.context.close();
    $("stop").disabled = true;
  }
}

async function play() {
  current?.stop();
  current = null;
  // Made inside the click, so the browser lets it sound.
  const context = new AudioContext();
  context.resume();
  $("download").hidden = true;
  const speed = Number($("speed").value);
  const body = { text: $("text").value, model: $("model").value, voice: $("voice").value || undefined, speed };
  setStatus("Submitting…");
  try {
    const job = await api("v1/jobs", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ ...body, format: "wav" }),
    });
    current = new Playback(job, context);
    $("stop").disabled = false;
    current.show();
    await current.run();
  } catch (error) {
    context.close();
    const message = explain(error);
    window.ttsPlayback = { fetched: [], played: [], log: [], events: [], ended: false, jobId: null, error: message };
    setStatus(`Could not start: ${message}`, true);
  }
}

// Speak as I type: the text box feeds a text stream (POST v1/jobs/{id}/text), a piece per change that only
// adds at the end; Play, or unticking the box, sends the final piece. Edits before the end are not spoken.
const live = { job: null, sent: "", seq: 0, queue: Promise.resolve(), opening: null };

// A piece refused with 503 and Retry-After (the job store is full, say) was not kept: it is sent again, with the same
// seq, up to PIECE_ATTEMPTS times in all, waiting what Retry-After says (at most PIECE_RETRY_MAX_S), as the Python
// client does.
const PIECE_ATTEMPTS = 6;
const PIECE_RETRY_MAX_S = 5;

async function postPiece(job, seq, text, final) {
  for (let attempt = 1; ; attempt++) {
    try {
      return await api(`v1/jobs/${job.id}/text`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ seq, text, final }),
      });
    } catch (error) {
      const busy = error instanceof ApiError && error.status === 503 && error.retryAfter !== null;
      if (!busy || attempt >= PIECE_ATTEMPTS) throw error;
      setStatus(`The service is busy (${error.code}); sending the text again in ${Math.min(error.retryAfter, PIECE_RETRY_MAX_S)} s…`);
      await new Promise((resolve) => setTimeout(resolve, 1000 * Math.min(error.retryAfter, PIECE_RETRY_MAX_S)));
    }
  }
}

function sendPiece(text, final = false) {
  const seq = live.seq++;
  const job = live.job;
  live.queue = live.queue
    .then(() => postPiece(job, seq, text, final))
    .catch((error) => setStatus(`Could not send the text: ${explain(error)}`, true));
  return live.queue;
}

async function openLive() {
  current?.stop();
  const context = new AudioContext();
  context.resume();
  const speed = Number($("speed").value);
  const body = { text: "", text_stream: true, model: $("model").value, voice: $("voice").value || undefined, speed };
  const job = await api("v1/jobs", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...body, format: "wav" }),
  });
  Object.assign(live, { job, sent: "", seq: 0, queue: Promise.resolve() });
  current = new Playback(job, context);
  $("stop").disabled = false;
  current.show();
  current.run();
}

async function typed() {
  if (!$("live").checked) return;
  const text = $("text").value;
  try {
    if (!live.job) {
      live.opening ??= openLive();
      await live.opening;
    }
  } catch (error) {
    live.opening = null;
    setStatus(`Could not start: ${explain(error)}`, true);
    return;
  }
  if (!text.startsWith(live.sent)) {
    setStatus("Only text added at the end is spoken while typing live.");
    return;
  }
  const piece = text.slice(live.sent.length);
  if (!piece) return;
  live.sent = text;
  sendPiece(piece);
}

function endLive() {
  if (!live.job) return false;
  sendPiece("", true);
  Object.assign(live, { job: null, opening: null });
  return true;
}

$("text").addEventListener("input", typed);
$("live").addEventListener("change", () => {
  if ($("live").checked) {
    $("text").value = "";
    $("text").focus();
  } else {
    endLive();
  }
});
$("model").addEventListener("change", fillVoices);
$("speed").addEventListener("input", () => {
  $("speed-value").value = `${Number($("speed").value).toFixed(2)}×`;
});
$("play").addEventListener("click", () => {
  if (!endLive()) play();
});
$("stop").addEventListener("click", () => {
  if (!current) return;
  current.stop();
  // Nobody will listen to the rest: let the workers skip it.
  if (current.made < current.total) {
    fetch(current.job.urls.self, { method: "DELETE", headers: authHeaders() }).catch(() => {});
  }
  setStatus("Stopped.");
});
// A plain link cannot send the key: with one, the file is fetched with it and handed over as a blob.
$("download").addEventListener("click", async (event) => {
  if (!apiKey()) return;
  event.preventDefault();
  try {
    const response = await fetch($("download").href, { headers: authHeaders() });
    if (!response.ok) throw await errorOf(response);
    const url = URL.createObjectURL(await response.blob());
    const link = Object.assign(document.createElement("a"), { href: url, download: $("download").download });
    link.click();
    setTimeout(() => URL.revokeObjectURL(url), 60_000);
  } catch (error) {
    setStatus(`Could not download: ${explain(error)}`, true);
  }
});
$("api-key").value = storedKey();
$("api-key").addEventListener("change", () => {
  storeKey(apiKey());
  loadModels();
});
loadModels();
