#!/usr/bin/env bash
# The second virtual environment, .venv/spark-3.5, with Spark 3.5 (the extra accepts >=3.5,<5):
# tests/spark/test_spark35.py runs every test of tests/spark again in it. Created once, then
# checked.
#   bash .ci/spark35-venv.sh prefetch   every dependency (pyspark 3.5: a 300 MB download and
#                                       build), not the project: .ci/setup runs it beside its
#                                       other steps; it writes nothing into the project's folder
#   bash .ci/spark35-venv.sh            the whole environment, the project installed editable
set -euo pipefail
cd "$(dirname "$0")/.."
venv35=.venv/spark-3.5
# The tested versions of everything else (constraints.txt), pyspark 3.5 instead of 4; its [sql]
# extra wants numpy below 2, and pyarrow 21 and later need numpy 2: both older here.
spark35=("pyspark[sql]>=3.5.2,<3.6" "pyarrow<21")
quiet() { "$@" 2>&1 | grep -v "is ignored" || true; }
# Done once the project is installed in it: its `relay` command is there (the prefetch installs
# everything else, pytest too).
if [ ! -x "$venv35/bin/relay" ]; then
    if [ ! -x "$venv35/bin/python" ]; then
        echo "==> $venv35 (pyspark 3.5)"
        "${PYTHON:-python3}" -m venv "$venv35"
        quiet "$venv35/bin/python" -m pip install -q --upgrade pip
    fi
    grep -v -i -E '^(pyspark|py4j|numpy|pyarrow)==' constraints.txt > "$venv35/constraints-3.5.txt"
    if [ "${1:-}" = prefetch ]; then
        # Every pinned package of the main environment (what the project and its extras
        # need), so that the final step only installs the project itself.
        quiet "$venv35/bin/python" -m pip install -q -c "$venv35/constraints-3.5.txt" \
            -r "$venv35/constraints-3.5.txt" "${spark35[@]}"
        "$venv35/bin/python" -c "import pyspark; print('pyspark', pyspark.__version__, 'fetched')"
        exit 0
    fi
    quiet "$venv35/bin/python" -m pip install -q -c "$venv35/constraints-3.5.txt" \
        -e ".[test,spark]" "${spark35[@]}"
fi
# pip's output is filtered above, not its failure: what the tests need must be there.
"$venv35/bin/relay" --help >/dev/null
"$venv35/bin/python" -c "import pyspark; print('pyspark', pyspark.__version__, 'in $venv35')"
