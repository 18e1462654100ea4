"""The generators of the documentation's reference pages (settings, message contract), and the
helpers they share to keep a generated block of a page equal to its source."""
