"""What Perseus shows people: text tables, matplotlib figures, Zeus frequency files and the
``perseus report`` page. Pure output: nothing here changes a plan or a clock."""
