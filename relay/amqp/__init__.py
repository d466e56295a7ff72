"""The broker side: the publish pipeline, its transports, frame encoding. aio-pika, aiormq and
pamqp live only here.
"""
