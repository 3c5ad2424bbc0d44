// Playhead's page: text in over the WebSocket, PCM out into an AudioWorklet ring buffer
// behind an adaptive jitter buffer (player-worklet.js), the player's position acked back
// every 200 ms (docs/websocket.md).

const ACK_EVERY_MS = 200;
const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const apiKey = params.get("api_key");

// The jitter buffer's initial playout delay (the pre-roll) and its cap, in ms; the URL may
// set them: /?preroll_ms=120&max_buffer_ms=2000.
function msParam(name, fallback, max) {
  const raw = params.get(name);
  if (raw === null) return fallback;
  const value = Number(raw);
  if (raw.trim() === "" || !Number.isFinite(value) || value < 0 || value > max) {
    throw new Error(`${name} must be a number of ms from 0 to ${max}, not ${JSON.stringify(raw)}`);
  }
  return value;
}

const ui = {
  text: $("text"),
  voice: $("voice"),
  speed: $("speed"),
  speedValue: $("speed-value"),
  live: $("live"),
  speak: $("speak"),
  stop: $("stop"),
  hint: $("hint"),
  connection: $("connection"),
  status: $("status"),
  log: $("log"),
  ttfa: $("ttfa"),
  ttfaSplit: $("ttfa-split"),
  jitter: $("jitter"),
  jitterWhy: $("jitter-why"),
  lowWater: $("low-water"),
  buffered: $("buffered"),
  bufferBar: $("buffer-bar"),
  played: $("played"),
  stalls: $("stalls"),
  stallTime: $("stall-time"),
  cancel: $("cancel"),
  cancelServer: $("cancel-server"),
  acks: $("acks"),
};

const state = {
  ws: null,
  wsReady: null, // a promise of the open socket
  ctx: null,
  player: null,
  rate: 48000,
  prerollMs: 100,
  maxBufferMs: 1000,
  starts: 0, // fresh starts of the player (each waited out a pre-roll)
  oddByte: null, // a PCM frame's last byte when a frame split a sample
  pushed: 0, // samples handed to the player, all utterances
  played: 0, // samples the player has output (its last report)
  buffered: 0,
  nextIndex: 0, // the server numbers utterances from 0, refused ones included
  open: null, // the utterance taking text: {index, sentAt}
  utterances: new Map(), // index -> {sentAt, firstAudioAt, startSample, endSample, done}
  receiving: null, // index of the utterance whose audio arrives now
  liveSent: 0, // characters of the text box already sent (type-as-you-go)
  acks: 0,
  stopAt: null, // Stop pressed, the server's audio.done (cancelled) not yet in
  flushAt: null, // Stop pressed, the player not yet silent
  // Stop cancels every utterance numbered below this; audio the server sent before it
  // read the cancel is dropped (binary frames belong to the last audio.start's utterance)
  cancelledBelow: 0,
  discarding: false,
};

function setReadout(el, value, text) {
  el.dataset.value = String(value);
  el.textContent = text;
}

function log(message, kind = "") {
  const item = document.createElement("li");
  const time = document.createElement("span");
  time.className = "t";
  time.textContent = new Date().toLocaleTimeString([], { hour12: false });
  const body = document.createElement("span");
  body.className = kind;
  body.textContent = message;
  item.append(time, body);
  ui.log.append(item);
  ui.log.scrollTop = ui.log.scrollHeight;
}

function setConnection(label, kind) {
  ui.connection.textContent = label;
  ui.connection.dataset.state = kind;
}

async function loadVoices() {
  const headers = apiKey ? { Authorization: `Bearer ${apiKey}` } : {};
  for (let attempt = 0; attempt < 60; attempt++) {
    const response = await fetch("/v1/audio/voices", { headers });
    if (response.ok) {
      const { voices } = await response.json();
      ui.voice.replaceChildren(
        ...voices.map((v) => {
          const option = document.createElement("option");
          option.value = v.id;
          option.textContent = `${v.name} · ${v.language} · ${Math.round(v.sample_rate / 100) / 10} kHz`;
          return option;
        }),
      );
      ui.status.textContent = `${voices.length} voice${voices.length === 1 ? "" : "s"} ready`;
      return;
    }
    ui.status.textContent = "The model is loading…";
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
  log("No voices: the server is not ready.", "error");
}

async function ensureAudio() {
  if (state.ctx) {
    if (state.ctx.state !== "running") await state.ctx.resume();
    return;
  }
  const ctx = new AudioContext({ latencyHint: "interactive" });
  await ctx.audioWorklet.addModule("/static/player-worklet.js");
  const player = new AudioWorkletNode(ctx, "ring-player", {
    outputChannelCount: [1],
    processorOptions: { prerollMs: state.prerollMs, maxDelayMs: state.maxBufferMs },
  });
  player.connect(ctx.destination);
  player.port.onmessage = ({ data }) => (data.event ? onPlayerEvent(data) : onPlayerReport(data));
  if (ctx.state !== "running") await ctx.resume();
  state.ctx = ctx;
  state.player = player;
  state.rate = Math.min(48000, Math.max(8000, Math.round(ctx.sampleRate)));
}

function connect() {
  if (state.wsReady) return state.wsReady;
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  const query = apiKey ? `?api_key=${encodeURIComponent(apiKey)}` : "";
  const ws = new WebSocket(`${scheme}://${location.host}/v1/audio/speech/stream${query}`);
  ws.binaryType = "arraybuffer";
  state.ws = ws;
  state.wsReady = new Promise((resolve, reject) => {
    ws.onopen = () => {
      setConnection("Connected", "open");
      resolve(ws);
    };
    ws.onerror = () => reject(new Error("the WebSocket failed"));
  });
  ws.onmessage = (event) => {
    if (typeof event.data === "string") onEvent(JSON.parse(event.data));
    else onAudio(event.data);
  };
  ws.onclose = (event) => {
    setConnection(`Closed (${event.code})`, event.code === 1000 ? "idle" : "error");
    log(`socket closed: ${event.code}${event.reason ? " " + event.reason : ""}`);
    state.ws = null;
    state.wsReady = null;
    state.open = null;
    state.receiving = null;
    expect(false);
    updateButtons();
  };
  return state.wsReady;
}

function send(message) {
  state.ws.send(JSON.stringify(message));
}

function sendConfig() {
  send({
    type: "session.config",
    voice: ui.voice.value,
    response_format: "pcm",
    sample_rate: state.rate,
    speed: Number(ui.speed.value),
  });
}

async function sendText(text) {
  await ensureAudio();
  await connect();
  if (!state.open) {
    sendConfig(); // applies to this utterance: the voice or speed may have changed
    state.open = { index: state.nextIndex++, sentAt: performance.now() };
    state.utterances.set(state.open.index, { sentAt: state.open.sentAt, done: false });
    ui.status.textContent = `Utterance ${state.open.index}: sending text`;
  }
  send({ type: "input.text", text });
  updateButtons();
}

function finishText() {
  if (!state.open) return;
  send({ type: "input.done" });
  state.open = null;
  if (state.receiving !== null) expect(true); // its text is complete now
  updateButtons();
}

// Tell the player whether audio is still due: a run-dry then is a stall, unless the
// utterance's text is still being typed (the audio waits for the words).
function expect(value) {
  const textOpen = value && state.open !== null && state.open.index === state.receiving;
  state.player?.port.postMessage({ type: "expect", value, textOpen });
}

async function speak() {
  if (ui.live.checked) {
    await sendLiveDelta();
    finishText();
    return;
  }
  const text = ui.text.value.trim();
  if (!text) return;
  if (state.open) finishText();
  await sendText(text + " ");
  finishText();
}

function stop() {
  if (!state.ws || !busy()) return;
  const serverBusy = Boolean(state.open) || state.receiving !== null;
  state.flushAt = performance.now();
  state.stopAt = serverBusy ? state.flushAt : null;
  state.player?.port.postMessage({ type: "flush" });
  state.cancelledBelow = state.nextIndex;
  state.discarding = true;
  ui.cancelServer.textContent = serverBusy ? "server: cancelling…" : "server: all audio was in";
  send({ type: "cancel" });
  state.open = null;
  if (ui.live.checked) state.liveSent = ui.text.value.length;
  ui.status.textContent = "Stopped";
  updateButtons();
}

async function sendLiveDelta() {
  const value = ui.text.value;
  if (value.length < state.liveSent) {
    state.liveSent = value.length; // deleted text cannot be unsaid
    return;
  }
  const delta = value.slice(state.liveSent);
  if (!delta) return;
  state.liveSent = value.length;
  await sendText(delta);
}

function onEvent(event) {
  if (event.type === "audio.start") {
    const u = state.utterances.get(event.utterance) ?? { sentAt: performance.now() };
    u.firstAudioAt = performance.now();
    state.discarding = event.utterance < state.cancelledBelow;
    u.startSample = state.pushed;
    state.utterances.set(event.utterance, u);
    state.receiving = event.utterance;
    state.oddByte = null;
    expect(true);
    const arrived = Math.round(u.firstAudioAt - u.sentAt);
    if (state.buffered > 0 && !state.discarding) {
      // The player is still busy with the utterance before: this one follows it, no pre-roll.
      setReadout(ui.ttfa, arrived, `${arrived} ms`);
      ui.ttfaSplit.textContent = `${arrived} ms, queued: no pre-roll`;
    }
    ui.status.textContent = `Utterance ${event.utterance}: playing`;
    log(`audio.start #${event.utterance} · ${event.format} ${event.sample_rate} Hz · first audio ${arrived} ms after its text`);
  } else if (event.type === "audio.done") {
    const u = state.utterances.get(event.utterance);
    if (u) {
      u.done = true;
      u.endSample = state.pushed;
      if (u.startSample === undefined) u.startSample = state.pushed;
    }
    if (state.receiving === event.utterance) state.receiving = null;
    expect(false);
    if (event.cancelled && state.stopAt !== null) {
      const ms = Math.round(performance.now() - state.stopAt);
      ui.cancelServer.textContent = `server: audio.done in ${ms} ms`;
      state.stopAt = null;
    }
    log(`audio.done #${event.utterance} · ${(event.audio_ms / 1000).toFixed(2)} s${event.cancelled ? " · cancelled" : ""}`);
    if (!event.cancelled) ui.status.textContent = `Utterance ${event.utterance}: all audio received`;
  } else if (event.type === "error") {
    const retry = event.retry_after_s ? ` (retry after ${event.retry_after_s} s)` : "";
    log(`error ${event.error.code}: ${event.error.message}${retry}`, "error");
    ui.status.textContent = `Error: ${event.error.code}`;
  } else if (event.type === "session.closed") {
    log("session closed");
  }
  updateButtons();
}

// s16le bytes of the utterance being received -> the player (which converts them); a
// frame that splits a sample leaves its last byte for the next.
function onAudio(buffer) {
  if (state.discarding) return;
  let bytes = new Uint8Array(buffer);
  if (state.oddByte !== null) {
    const joined = new Uint8Array(bytes.length + 1);
    joined[0] = state.oddByte;
    joined.set(bytes, 1);
    bytes = joined;
    state.oddByte = null;
  }
  if (bytes.length % 2 === 1) {
    state.oddByte = bytes[bytes.length - 1];
    bytes = bytes.slice(0, bytes.length - 1);
  }
  if (bytes.length === 0) return;
  const pcm = bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength
    ? bytes.buffer
    : bytes.slice().buffer;
  state.pushed += pcm.byteLength / 2;
  state.player.port.postMessage({ type: "push", pcm }, [pcm]);
}

const toMs = (samples) => Math.round((1000 * samples) / state.rate);
const JITTER_WHY = {
  initial: "pre-roll; grows if late",
  stall: "grown after a stall",
  "near miss": "grown after a near miss",
  eased: "eased: audio came early",
};

function onPlayerEvent(event) {
  const at = `at ${(event.at / state.rate).toFixed(2)} s played`;
  const buffer = `jitter buffer ${toMs(event.delay)} ms`;
  if (event.event === "stall") {
    log(`stall ${at}: dry ${toMs(event.dry)} ms until the next chunk came; ${buffer}`, "warn");
  } else if (event.event === "near miss") {
    log(`near miss ${at}: a chunk came with ${toMs(event.slack)} ms left; ${buffer}`);
  } else {
    log(`the audio came early: ${buffer}`);
  }
}

function onPlayerReport(report) {
  state.played = report.played;
  state.buffered = report.buffered;
  if (report.starts > state.starts) {
    state.starts = report.starts;
    onFreshStart(report);
  }
  const delayMs = toMs(report.delay);
  setReadout(ui.jitter, delayMs, `${delayMs} ms`);
  ui.jitter.dataset.grown = String(report.delay > report.initialDelay);
  ui.jitterWhy.textContent = JITTER_WHY[report.reason] ?? report.reason;
  if (report.lowWater === null) setReadout(ui.lowWater, "", "–");
  else setReadout(ui.lowWater, toMs(report.lowWater), `${toMs(report.lowWater)} ms`);
  const bufferedMs = Math.round((1000 * report.buffered) / state.rate);
  setReadout(ui.buffered, bufferedMs, `${bufferedMs} ms`);
  ui.bufferBar.style.width = `${Math.min(100, bufferedMs / 50)}%`; // full at 5 s
  const playedS = report.played / state.rate;
  setReadout(ui.played, playedS.toFixed(3), `${playedS.toFixed(1)} s`);
  setReadout(ui.stalls, report.stalls, String(report.stalls));
  ui.stalls.dataset.bad = String(report.stalls > 0);
  ui.stallTime.textContent = `${Math.round((1000 * report.stallSamples) / state.rate)} ms silent`;
  if (state.flushAt !== null && report.buffered === 0) {
    const ms = Math.round(performance.now() - state.flushAt);
    setReadout(ui.cancel, ms, `${ms} ms`);
    state.flushAt = null;
  }
  updateButtons();
}

// The player started after a pre-roll: time to first audio is the utterance's arrival
// plus that wait, when this start is the utterance's first sound.
function onFreshStart(report) {
  const position = playingPosition(report.played);
  if (!position) return;
  const u = state.utterances.get(position.index);
  if (!u || u.firstAudioAt === undefined || u.soundAt !== undefined || position.playedMs > 0) return;
  const arrived = Math.round(u.firstAudioAt - u.sentAt);
  const preroll = toMs(report.lastWait);
  u.soundAt = u.firstAudioAt + preroll;
  setReadout(ui.ttfa, arrived + preroll, `${arrived + preroll} ms`);
  ui.ttfa.dataset.arrived = String(arrived);
  ui.ttfa.dataset.preroll = String(preroll);
  ui.ttfaSplit.textContent = `${arrived} + ${preroll} ms pre-roll`;
}

// The utterance holding sample `played` of the player, and how far into it (ms).
function playingPosition(played = state.played) {
  let found = null;
  for (const [index, u] of state.utterances) {
    if (u.startSample === undefined || u.startSample > played) continue;
    const end = u.done ? u.endSample : Infinity;
    if (played < end || (!u.done && played >= u.startSample)) {
      found = { index, playedMs: (1000 * (played - u.startSample)) / state.rate };
    }
  }
  return found;
}

function ack() {
  if (!state.ws || state.ws.readyState !== WebSocket.OPEN) return;
  const position = playingPosition();
  if (!position) return;
  send({ type: "playback.position", utterance: position.index, played_ms: Math.round(position.playedMs) });
  state.acks += 1;
  setReadout(ui.acks, state.acks, String(state.acks));
}

function busy() {
  return Boolean(state.open) || state.receiving !== null || state.buffered > 0;
}

function updateButtons() {
  ui.stop.disabled = !busy();
  ui.speak.textContent = ui.live.checked ? "Finish" : "Speak";
}

ui.speak.addEventListener("click", () => speak().catch((e) => log(String(e), "error")));
ui.stop.addEventListener("click", stop);
ui.speed.addEventListener("input", () => {
  ui.speedValue.textContent = `${Number(ui.speed.value).toFixed(2)}×`;
});
ui.live.addEventListener("change", () => {
  if (ui.live.checked) {
    state.liveSent = ui.text.value.length;
    ui.hint.textContent = "Words are sent as you type; Enter or Finish ends the utterance.";
    ui.text.focus();
  } else {
    finishText();
    ui.hint.textContent = "Speak sends the whole text; Stop cuts the speech at once.";
  }
  updateButtons();
});
ui.text.addEventListener("input", () => {
  if (ui.live.checked) sendLiveDelta().catch((e) => log(String(e), "error"));
});
ui.text.addEventListener("keydown", (event) => {
  if (ui.live.checked && event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    speak().catch((e) => log(String(e), "error"));
  }
});

try {
  state.prerollMs = msParam("preroll_ms", state.prerollMs, 2000);
  state.maxBufferMs = Math.max(state.prerollMs, msParam("max_buffer_ms", state.maxBufferMs, 10000));
} catch (e) {
  log(`${e.message}; using ${state.prerollMs} ms and ${state.maxBufferMs} ms`, "error");
}
setReadout(ui.jitter, state.prerollMs, `${state.prerollMs} ms`);
setInterval(ack, ACK_EVERY_MS);
loadVoices().catch((e) => log(String(e), "error"));
