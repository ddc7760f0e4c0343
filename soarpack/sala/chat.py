"""The chat template of the tiny models, shaped like MiniCPM-SALA's; also what `soarpack build` renders every shipped
chat row through (no torch here: a build machine needs none to check its calibration)."""

# Shaped like MiniCPM's template: <|im_start|>role\ncontent<|im_end|>\n turns; the reasoning of earlier assistant
# turns is dropped; `enable_thinking=False` pre-fills an empty think block.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' and '</think>' in message['content'] -%}"
    "{%- set content = message['content'].split('</think>')[-1].lstrip('\\n') -%}"
    "{%- else -%}{%- set content = message['content'] -%}{%- endif -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}"
    "{%- endif -%}"
)
