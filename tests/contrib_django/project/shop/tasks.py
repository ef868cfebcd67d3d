import os

import echomq
from shop.models import Order


@echomq.task(queue=os.environ.get("SHOP_QUEUE", "shop"))
def ship(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)  # the consumer's own connection, opened here
    order.shipped_by = os.getpid()
    order.save()
    return f"shipped {order.item}"


@echomq.task(queue=os.environ.get("SHOP_QUEUE", "shop"))
def backend_pid() -> int:
    """The PostgreSQL backend serving this consumer's Django connection."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])
