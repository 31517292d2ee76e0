"""Tables: reading, column conversion, binning, labels, the demo datasets and splitting them into parties."""
