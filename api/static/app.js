// Hear a job while it is made: fetch segment 0 the moment it exists (?wait= long-poll), then the rest in
// order, keeping at most LOOKAHEAD segments fetched ahead of the one playing, scheduled back to back with
// the Web Audio API so there is no gap between sentences.
"use strict";

const LOOKAHEAD = 2;
const WAIT_S = 30;

const $ = (id) => document.getElementById(id);
let models = new Map();
let current = null;

// What happened, for people debugging and for tests: indices fetched and played (and both in the order
// they happened, in log), and whether all played.
window.ttsPlayback = { fetched: [], played: [], log: [], ended: false, jobId: null, error: null };

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(path, options = {}) {
  const response = await fetch(path, options);
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    throw new ApiError(response.status, body?.error?.code ?? "http_error", body?.error?.message ?? response.statusText);
  }
  return body;
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
  } catch (error) {
    setStatus(`Could not load the models: ${error.message}`, true);
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
  constructor(job, context) {
    this.job = job;
    this.total = job.segments_total;
    this.context = context;
    this.abort = new AbortController();
    this.stopped = false;
    this.nextStart = 0;
    this.made = 0;
    this.audioSeconds = 0;
    this.waiters = [];
    this.state = { fetched: [], played: [], log: [], ended: false, jobId: job.id, error: null };
    window.ttsPlayback = this.state;
    $("made").max = $("heard").max = this.total;
    this.events = this.follow();
  }

  // Server-sent events tell how far the service has got; the browser reconnects with Last-Event-ID by itself.
  follow() {
    const source = new EventSource(this.job.urls.events);
    source.addEventListener("segment", (event) => {
      this.made = JSON.parse(event.data).index + 1;
      this.show();
    });
    for (const end of ["done", "failed", "canceled", "expired"]) {
      source.addEventListener(end, (event) => {
        source.close();
        if (end === "done") {
          $("download").href = this.job.urls.audio;
          $("download").hidden = false;
        } else if (!this.stopped) {
          this.fail(new Error(`the job ${end}: ${JSON.parse(event.data).error ?? "no reason given"}`));
        }
      });
    }
    return source;
  }

  async run() {
    try {
      for (let index = 0; index < this.total && !this.stopped; index++) {
        await this.untilPlayed(index - LOOKAHEAD);
        if (this.stopped) return;
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
        const response = await fetch(url, { signal: this.abort.signal });
        if (response.ok) return await response.arrayBuffer();
        const body = await response.json().catch(() => null);
        if (response.status !== 409 || body?.error?.code !== "not_ready") {
          throw new ApiError(response.status, body?.error?.code, body?.error?.message ?? `segment ${index} failed`);
        }
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

  untilPlayed(count) {
    return new Promise((resolve) => {
      const check = () => (this.stopped || this.state.played.length >= count ? (resolve(), true) : false);
      if (!check()) this.waiters.push(check);
    });
  }

  show() {
    $("made").value = this.made;
    $("heard").value = this.state.played.length;
    if (this.state.error || this.stopped) return;
    const verb = this.state.ended ? "Finished" : "Playing";
    setStatus(
      `${verb}: made ${this.made}/${this.total} · fetched ${this.state.fetched.length} · ` +
        `played ${this.state.played.length} · ${this.audioSeconds.toFixed(1)} s of audio`,
    );
  }

  finish() {
    this.state.ended = true;
    $("stop").disabled = true;
    this.context.close();
  }

  fail(error) {
    this.state.error = error.message;
    setStatus(`Stopped: ${error.message}`, true);
    this.stop();
  }

  stop() {
    if (this.stopped) return;
    this.stopped = true;
    this.abort.abort();
    this.events.close();
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
    window.ttsPlayback = { fetched: [], played: [], log: [], ended: false, jobId: null, error: error.message };
    setStatus(`Could not start: ${error.message}`, true);
  }
}

$("model").addEventListener("change", fillVoices);
$("speed").addEventListener("input", () => {
  $("speed-value").value = `${Number($("speed").value).toFixed(2)}×`;
});
$("play").addEventListener("click", play);
$("stop").addEventListener("click", () => {
  if (!current) return;
  current.stop();
  // Nobody will listen to the rest: let the workers skip it.
  if (current.made < current.total) fetch(current.job.urls.self, { method: "DELETE" }).catch(() => {});
  setStatus("Stopped.");
});
loadModels();
