"""Federated Extra-Trees (the FET paper).

`master` (the level strategy of the one grower, privacy modes none / gdp / ldp) and `party` (the institution's
role and its protocol table).
"""
