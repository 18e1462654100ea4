"""The contract: every record that crosses a process boundary, one typed, versioned
definition each, used by its producers, its consumers and the tests, so a schema change is
one diff in one place.

docs/contract.md says where each record travels, who writes it and who reads it, and shows
every record's fields (generated from these modules). Import a name from the module that
defines it (``from iotwatch.contract.alerts import AlertRecord``): one home per name.
"""
