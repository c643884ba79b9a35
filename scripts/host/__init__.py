"""The serving box and the image: facts about the host, and the verbs that run there.

Verbs: doctor, serve, smoke, image, image_test, gpu_tier, in_image (python -m scripts.host.<verb>; in the image
through docker/entrypoint: serve, doctor, smoke, test-gpu, test-serve, bench-comm, bench-client). Library: docker_run
(the one `docker run` of the image, the HF cache, /results), engine (the docker engine), exposure (who can reach the
server), drafters, facts (what the doctor knows: tool outputs, live or recorded, and their parsers), checks (the
doctor's registered checks), nccl (NCCL facts and the GPU probes: NCCL transport, PCIe-IPC smoke, peer bandwidth).
Runs on the upstream image's python3: nothing here needs more than it ships.
"""
