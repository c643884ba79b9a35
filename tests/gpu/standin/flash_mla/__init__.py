"""Import-only stand-in (tests/gpu/standin/eagle_importonly.py says why and how)."""

from eagle_importonly import stand_in

STANDIN = True
stand_in(__name__)
