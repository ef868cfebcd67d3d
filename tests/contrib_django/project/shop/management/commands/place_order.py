"""Place an order and send its shipping task in one transaction; --fail rolls it back."""

import json

from django.core.management.base import BaseCommand
from django.db import connection, transaction

import echomq
from shop.models import Order
from shop.tasks import ship


class Command(BaseCommand):
    def add_arguments(self, parser):  # type: ignore[no-untyped-def]
        parser.add_argument("item")
        parser.add_argument("--fail", action="store_true")
        parser.add_argument("--outside", action="store_true", help="send with no transaction")

    def handle(self, *args, **options):  # type: ignore[no-untyped-def]
        queue = echomq.Queue(ship.queue)
        if options["outside"]:
            order = Order.objects.create(item=options["item"])
            jid = ship.send(order.pk)
            print(json.dumps({"job": jid, "exists_before_commit": queue.get(jid) is not None}))
            return
        seen: dict[str, object] = {}
        try:
            with transaction.atomic():
                order = Order.objects.create(item=options["item"])
                seen["job"] = jid = ship.send(order.pk)
                seen["added"] = queue.add(ship.name, {"args": [order.pk], "kwargs": {}})
                seen["exists_before_commit"] = queue.get(jid) is not None
                with connection.cursor() as cursor:  # this transaction's view of the outbox
                    cursor.execute("SELECT count(*) FROM emq_outbox")
                    seen["outbox_rows"] = cursor.fetchone()[0]
                if options["fail"]:
                    raise RuntimeError("payment refused")
        except RuntimeError:
            seen["rolled_back"] = True
        seen["exists_after"] = queue.get(str(seen["job"])) is not None
        print(json.dumps(seen))
