// Hear a job while it is made: its event stream (?fragments=1) brings each fragment of audio as the model makes it
// (200-500 ms of 16-bit PCM, inline), and each is scheduled with the Web Audio API where the one before it ends, so
// fragments and sentences follow without a gap. Playback starts once PREFETCH fragments are buffered (or a segment,
// or the job, has ended), and again so after it ran dry: one fragment in hand absorbs the jitter of the next. A
// dropped stream is asked for again with Last-Event-ID, which resumes at the next fragment. A service that asks for
// an API key gets the one typed into the page (kept in localStorage) as "Authorization: Bearer" on every request,
// the event stream included: EventSource cannot send headers, so the stream is read with fetch() instead, and the
// key never goes in a URL.
"use strict";

const PREFETCH = 2;
const KEY_STORAGE = "tts-api-key";
// How many times in a row the event stream may drop without delivering anything before the page gives up on it.
const SSE_RECONNECTS = 5;

const $ = (id) => document.getElementById(id);
let models = new Map();
let current = null;

// What happened, for people debugging and for tests: segments whose audio all arrived (received) and that were
// played whole (played), each fragment received and heard ("index.n"), each fragment's place on the audio clock
// (scheduled), all in the order they happened in log, and whether all played.
const emptyPlayback = (jobId = null, error = null) => ({
  received: [], played: [], fragments: [], heard: [], scheduled: [], log: [], events: [], ended: false, jobId, error,
});
window.ttsPlayback = emptyPlayback();

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

// 16-bit little-endian PCM, base64, as an AudioBuffer (the context resamples it to its own rate as it plays).
function audioBuffer(context, pcm16, sampleRate) {
  const bytes = Uint8Array.from(atob(pcm16), (c) => c.charCodeAt(0));
  const view = new DataView(bytes.buffer);
  const samples = new Float32Array(bytes.length >> 1);
  for (let i = 0; i < samples.length; i++) samples[i] = view.getInt16(2 * i, true) / 32768;
  const buffer = context.createBuffer(1, samples.length, sampleRate);
  buffer.copyToChannel(samples, 0);
  return buffer;
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
    this.streamEnded = false;
    this.running = false; // audio is scheduled ahead of the clock; otherwise fragments wait for PREFETCH
    this.nextStart = 0;
    this.made = 0;
    this.audioSeconds = 0;
    this.queue = []; // fragments received, not yet scheduled
    this.segments = new Map(); // index -> {received, heard, complete}: a segment is played once all are heard
    this.state = emptyPlayback(job.id);
    window.ttsPlayback = this.state;
    $("made").max = $("heard").max = this.open ? 1 : this.total;
  }

  // Follow the job's events until it ends; each fragment is played as it comes.
  async run() {
    try {
      await this.follow();
    } catch (error) {
      if (!this.stopped) this.fail(error);
    }
  }

  // Server-sent events bring the audio and tell how far the service has got. After a dropped connection the stream
  // is asked for again with Last-Event-ID, so no fragment is missed or repeated; an HTTP error ends it.
  async follow() {
    let lastId = null;
    let failures = 0;
    while (!this.stopped) {
      let received = false;
      try {
        const headers = authHeaders({ Accept: "text/event-stream" });
        if (lastId !== null) headers["Last-Event-ID"] = lastId;
        const url = `${this.job.urls.events}?fragments=1`;
        const response = await fetch(url, { headers, cache: "no-store", signal: this.abort.signal });
        if (!response.ok) throw await errorOf(response);
        for await (const event of readEvents(response.body)) {
          received = true;
          if (event.id !== null) lastId = event.id;
          if (this.onEvent(event.event, event.data)) return;
        }
      } catch (error) {
        if (this.stopped || error instanceof ApiError) throw error;
      }
      failures = received ? 0 : failures + 1;
      if (failures > SSE_RECONNECTS) throw new Error("the event stream kept dropping");
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
    if (name === "fragment") {
      this.received(payload);
      return false;
    }
    if (name === "segment") {
      this.made = payload.index + 1;
      if (this.open && payload.segments_total != null) this.total = payload.segments_total;
      this.segment(payload.index).complete = true;
      this.state.received.push(payload.index);
      this.state.log.push(`received ${payload.index}`);
      this.pump();
      this.checkPlayed(payload.index);
      this.show();
      return false;
    }
    if (!["done", "failed", "canceled", "expired"].includes(name)) return false;
    this.streamEnded = true;
    if (this.open) {
      this.open = false;
      this.total = this.made;
    }
    this.pump();
    if (this.state.played.length >= this.total) this.finish();
    if (name === "done") {
      $("download").href = this.job.urls.audio;
      $("download").hidden = false;
    } else if (!this.stopped) {
      this.fail(new Error(`the job ${name}: ${payload.error ?? "no reason given"}`));
    }
    this.show();
    return true;
  }

  segment(index) {
    if (!this.segments.has(index)) this.segments.set(index, { received: 0, heard: 0, complete: false });
    return this.segments.get(index);
  }

  received(fragment) {
    const id = `${fragment.index}.${fragment.fragment}`;
    this.state.fragments.push(id);
    this.state.log.push(`fragment ${id}`);
    this.segment(fragment.index).received += 1;
    const buffer = fragment.samples > 0 ? audioBuffer(this.context, fragment.pcm16, fragment.sample_rate) : null;
    this.queue.push({ id, index: fragment.index, last: fragment.last, buffer });
    this.pump();
  }

  // Schedule what is queued: at once while audio is playing, else once PREFETCH fragments are in hand (or what is
  // in hand ends a segment, or the job: nothing more is coming soon).
  pump() {
    if (this.stopped) return;
    if (this.running && this.nextStart < this.context.currentTime) this.running = false; // it ran dry
    if (!this.running) {
      const ends = this.streamEnded || this.queue.some((f) => f.last || this.segment(f.index).complete);
      if (this.queue.length < PREFETCH && !(ends && this.queue.length)) return;
      this.running = true;
      this.state.log.push(`start with ${this.queue.length}`);
    }
    while (this.queue.length) this.schedule(this.queue.shift());
  }

  // Start each fragment where the previous one ends, so fragments and sentences follow without a gap.
  schedule(fragment) {
    if (fragment.buffer === null) {
      this.heard(fragment); // nothing to hear: an empty fragment only ends its segment
      return;
    }
    const source = this.context.createBufferSource();
    source.buffer = fragment.buffer;
    source.connect(this.context.destination);
    const now = this.context.currentTime;
    const at = Math.max(now + 0.05, this.nextStart);
    source.onended = () => {
      if (!this.stopped) this.heard(fragment);
    };
    source.start(at);
    this.state.scheduled.push({ id: fragment.id, now, at, duration: fragment.buffer.duration });
    this.nextStart = at + fragment.buffer.duration;
    this.audioSeconds += fragment.buffer.duration;
  }

  heard(fragment) {
    this.state.heard.push(fragment.id);
    this.state.log.push(`heard ${fragment.id}`);
    this.segment(fragment.index).heard += 1;
    this.checkPlayed(fragment.index);
    this.show();
  }

  // A segment is played once its end is known and every fragment of it was heard.
  checkPlayed(index) {
    const segment = this.segment(index);
    if (!segment.complete || segment.heard < segment.received || this.state.played.includes(index)) return;
    this.state.played.push(index);
    this.state.log.push(`played ${index}`);
    if (this.state.played.length >= this.total) this.finish();
  }

  show() {
    if (this.total !== Infinity) $("made").max = $("heard").max = this.total;
    $("made").value = this.made;
    $("heard").value = this.state.played.length;
    if (this.state.error || this.stopped) return;
    const verb = this.state.ended ? "Finished" : "Playing";
    setStatus(
      `${verb}: made ${this.made}/${this.total === Infinity ? "…" : this.total} · ` +
        `received ${this.state.fragments.length} fragments · played ${this.state.played.length} · ` +
        `${this.audioSeconds.toFixed(1)} s of audio`,
    );
  }

  finish() {
    if (this.state.ended) return;
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
    this.abort.abort(); // ends the event stream
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
  const body = { text: $("text").value, model: $("model").value, voice: $("voice").value || undefined, mode: $("mode").value, speed };
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
    window.ttsPlayback = emptyPlayback(null, message);
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
  const body = { text: "", text_stream: true, model: $("model").value, voice: $("voice").value || undefined, mode: $("mode").value, speed };
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
