"""The serving box and the image: facts about the host, and the verbs that run there.

Verbs: doctor, serve, smoke, image, image_deps, gpu_tier, serve_tier (python -m scripts.host.<verb>; in the image
through docker/entrypoint: serve, doctor, smoke, test-gpu, test-serve). Library: facts (what the doctor knows: tool
outputs, live or recorded, and their parsers), checks (the doctor's registered checks), nccl (NCCL facts and the GPU
probes: NCCL transport, PCIe-IPC smoke, peer bandwidth), pcie (the patched launcher asked what it decides). Runs on
the upstream image's python3: nothing here needs more than it ships.
"""
