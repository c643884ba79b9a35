"""The serving box and the image: doctor, serve, smoke, image, gpu_tier, in_image and their libraries.
Runs on the upstream image's python3: nothing here needs more than it ships."""
