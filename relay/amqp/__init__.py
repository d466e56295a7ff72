"""The broker side: the publish pipeline, its transports, frame encoding. aio-pika, aiormq and
pamqp live only here.
"""

# Importing the package installs the relay's one change to pamqp's encoding (header floats as
# doubles, relay/amqp/compat.py) before anything encodes a frame.
from relay.amqp import compat as _compat  # noqa: F401
