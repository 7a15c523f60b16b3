"""Writes llama_quantize_rows.gguf: four rows of one tensor of each type kept as the file's bytes,
cut from SmolLM2-135M-Instruct requantized by llama.cpp's own llama-quantize (real weights, real
quantizer). Run by hand, not by the tests (CI has no llama.cpp):

    Q=.../llama.cpp/build/bin/llama-quantize; G=SmolLM2-135M-Instruct.Q4_1.gguf
    for t in Q3_K_S Q4_K_M Q5_K_M Q6_K IQ4_NL IQ4_XS; do $Q --allow-requantize $G smol-$t.gguf $t; done
    $Q --allow-requantize --tensor-type ffn_down=q2_k $G smol-Q2_K-ffn_down_q2k.gguf Q2_K
    python tests/data/llama_quantize_rows.py DIR_OF_THOSE_FILES
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

# type: the requantized file whose first tensor of that type is cut
SOURCES = {"Q2_K": "smol-Q2_K-ffn_down_q2k.gguf", "Q3_K": "smol-Q3_K_S.gguf", "Q4_K": "smol-Q4_K_M.gguf",
           "Q5_K": "smol-Q5_K_M.gguf", "Q6_K": "smol-Q6_K.gguf", "Q5_0": "smol-Q4_K_M.gguf",
           "IQ4_NL": "smol-IQ4_NL.gguf", "IQ4_XS": "smol-IQ4_XS.gguf"}
ROWS = 4


def main(src: Path) -> None:
    w = GGUFWriter(str(Path(__file__).with_name("llama_quantize_rows.gguf")), "llama")
    for kind, name in SOURCES.items():
        t = next(t for t in GGUFReader(src / name).tensors if t.tensor_type.name == kind)
        rows = np.asarray(t.data).reshape(int(t.shape[1]), -1)[:ROWS]
        w.add_tensor(f"{name.removesuffix('.gguf')}.{t.name}", np.ascontiguousarray(rows), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
