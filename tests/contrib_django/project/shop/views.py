import json

from django.db import transaction
from django.http import HttpRequest, HttpResponse

from shop.models import Order
from shop.tasks import ship


@transaction.atomic
def place(request: HttpRequest, item: str) -> HttpResponse:
    """Place an order and send its shipping task; ?fail=1 raises after the send."""
    order = Order.objects.create(item=item)
    jid = ship.send(order.pk)
    if request.GET.get("fail"):
        raise RuntimeError(f"payment refused for job {jid}")
    return HttpResponse(json.dumps({"job": jid, "order": order.pk}),
                        content_type="application/json")
