"""GPTQ W4A16 of MiniCPM-SALA that SGLang's gptq_marlin serves as is.

options     the typed options of a run and their defaults (the only ones); calibration settings: soarpack.recipe
calib       calibration rows and disjoint held-out rows: SOAR/text/messages JSONL or text files, or built-in prompts
run         `quantize()`: check -> calibration -> load -> sanity -> gptq -> save -> quality -> verify
logfile     where a run's output goes: the caller's events, the --log file, the libraries' capture (capture)
quality     the math of the sanity and quality phases: next-token loss, log-probabilities, KL
engine      the one seam to GPTQModel: the SALA definition and its transformers view, its QuantizeConfig, `run_gptq`
finalize    the checkpoint files: packed tensors, original 16-bit tensors, config.json, side files byte for byte
gptq_format the GPTQ v1 tensor layout read back in PyTorch (unpack, dequantize, Marlin's reading, RTN on a grid)
dequantize  a quantized checkpoint as a float SalaForCausalLM
verify      every problem a checkpoint has for gptq_marlin, and against the original
"""
