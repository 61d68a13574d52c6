# pypool in a container.
#
#   docker build -t pypool .
#   docker run -v $PWD/config:/etc/pypool -p 6432:6432 pypool
#
# The mounted directory holds pypool.ini and the userlist.txt it names (auth_file is
# relative to the ini, so /etc/pypool/userlist.txt). Inside a container the ini must say
#   listen_addr = 0.0.0.0
# (config/pypool.ini says 127.0.0.1, which is unreachable through -p), and the
# [databases] host must be one the container can reach: 127.0.0.1 is the container
# itself, so use the database's address, host.docker.internal, or --network host.
# The first stage has a C compiler: the wheel carries the hot path compiled with mypyc
# (pypool/compiled.py). The image itself is the slim one.
FROM python:3.11 AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY pypool/ ./pypool/
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels

RUN useradd --system --no-create-home --shell /usr/sbin/nologin pypool \
    && mkdir -p /etc/pypool
USER pypool
WORKDIR /

EXPOSE 6432
# SIGINT: stop accepting, let running transactions finish, exit (`docker stop` sends it).
STOPSIGNAL SIGINT
ENTRYPOINT ["pypool"]
CMD ["/etc/pypool/pypool.ini"]
