"""The application: the ``iotwatch`` program and what composes the stages.

It sits above every stage and imports them with ordinary imports: the root command group
(:mod:`iotwatch.application.cli`), ``iotwatch demo``, ``chaos``, ``bench``, ``stack``,
``provision``, ``setup`` and ``deadletters``, and the generators of the reference pages. No
stage and nothing of the core imports it.
"""
