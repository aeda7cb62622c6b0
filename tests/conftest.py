import os

import jax

# float64 gradient checks need x64; every test names its dtypes explicitly.
jax.config.update("jax_enable_x64", True)

HERE = os.path.dirname(__file__)
