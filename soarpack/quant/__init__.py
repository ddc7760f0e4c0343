"""GPTQ W4A16 of MiniCPM-SALA that SGLang's gptq_marlin serves as is.

recipe      named rule sets over the decoder linears (TOML) -> the `dynamic` dict GPTQModel and SGLang both read
calib       calibration rows: SOAR/text/messages JSONL or text files, or built-in long-context-shaped prompts
run         `quantize()`: check -> calibration -> load -> sanity -> gptq (GPTQModel) -> save -> quality -> verify
finalize    the checkpoint files: packed tensors, original 16-bit tensors, config.json, side files byte for byte
gptq_format the GPTQ v1 tensor layout read back in PyTorch (unpack, dequantize, Marlin's reading, RTN on a grid)
dequantize  a quantized checkpoint as a float SalaForCausalLM
verify      every problem a checkpoint has for gptq_marlin, and against the original
"""
