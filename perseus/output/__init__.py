"""What Perseus shows people: text tables, matplotlib figures, Zeus frequency files and the
``perseus report`` page (``run_data`` → ``run_stats`` → ``report_page``, figures in ``plot``, words
for a saving in ``wording``). Pure output: nothing here changes a plan or a clock."""
