// Playhead's page: text in over the WebSocket, PCM out into an AudioWorklet ring buffer,
// the player's position acked back every 200 ms (docs/websocket.md).

const ACK_EVERY_MS = 200;
const $ = (id) => document.getElementById(id);

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
  buffered: $("buffered"),
  bufferBar: $("buffer-bar"),
  played: $("played"),
  stalls: $("stalls"),
  stallTime: $("stall-time"),
  cancel: $("cancel"),
  cancelServer: $("cancel-server"),
  acks: $("acks"),
};

const apiKey = new URLSearchParams(location.search).get("api_key");

const state = {
  ws: null,
  wsReady: null, // a promise of the open socket
  ctx: null,
  player: null,
  rate: 48000,
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
  const player = new AudioWorkletNode(ctx, "ring-player", { outputChannelCount: [1] });
  player.connect(ctx.destination);
  player.port.onmessage = (event) => onPlayerReport(event.data);
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
    state.player?.port.postMessage({ type: "expect", value: false });
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
  updateButtons();
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
    state.player.port.postMessage({ type: "expect", value: true });
    const ttfa = Math.round(u.firstAudioAt - u.sentAt);
    setReadout(ui.ttfa, ttfa, `${ttfa} ms`);
    ui.status.textContent = `Utterance ${event.utterance}: playing`;
    log(`audio.start #${event.utterance} · ${event.format} ${event.sample_rate} Hz · first audio ${ttfa} ms after its text`);
  } else if (event.type === "audio.done") {
    const u = state.utterances.get(event.utterance);
    if (u) {
      u.done = true;
      u.endSample = state.pushed;
      if (u.startSample === undefined) u.startSample = state.pushed;
    }
    if (state.receiving === event.utterance) state.receiving = null;
    state.player.port.postMessage({ type: "expect", value: false });
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

function onAudio(buffer) {
  if (state.discarding) return;
  const pcm = new Int16Array(buffer);
  const samples = new Float32Array(pcm.length);
  for (let i = 0; i < pcm.length; i++) samples[i] = pcm[i] / 32768;
  state.pushed += samples.length;
  state.player.port.postMessage({ type: "push", samples }, [samples.buffer]);
}

function onPlayerReport(report) {
  state.played = report.played;
  state.buffered = report.buffered;
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

// The utterance the player is in, and how far into it (ms).
function playingPosition() {
  let found = null;
  for (const [index, u] of state.utterances) {
    if (u.startSample === undefined || u.startSample > state.played) continue;
    const end = u.done ? u.endSample : Infinity;
    if (state.played < end || (!u.done && state.played >= u.startSample)) {
      found = { index, playedMs: (1000 * (state.played - u.startSample)) / state.rate };
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

setInterval(ack, ACK_EVERY_MS);
loadVoices().catch((e) => log(String(e), "error"));
