"""WS /v1/audio/speech/stream: live text in, audio out, playback acks and barge-in."""
